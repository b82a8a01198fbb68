//! The classifier labels as a `Copy` bitset: the policy engine matches rules on their names
//! (`pii`, `pii:email`, `size:small`, ...), explain and metrics print them. The set of names
//! is fixed here, so a label is never a client-controlled string and may be a metric label.

use std::fmt;

/// One classifier label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Label {
    /// Any personal data found (set with at least one `pii:*` kind).
    Pii,
    /// An e-mail address.
    PiiEmail,
    /// A phone number (E.164 or a national format).
    PiiPhone,
    /// An IBAN with a valid MOD 97 checksum.
    PiiIban,
    /// A payment card number (Luhn, known issuer prefix).
    PiiCard,
    /// A national identity or tax number (US, NL, ES, GB, FR, DE).
    PiiNationalId,
    /// A cheap request (see `SizeConfig`).
    SizeSmall,
    /// Neither small nor large.
    SizeMedium,
    /// An expensive request: a long prompt, a long output or many messages.
    SizeLarge,
}

impl Label {
    /// Every label, in bit order.
    pub const ALL: [Label; 9] = [
        Label::Pii,
        Label::PiiEmail,
        Label::PiiPhone,
        Label::PiiIban,
        Label::PiiCard,
        Label::PiiNationalId,
        Label::SizeSmall,
        Label::SizeMedium,
        Label::SizeLarge,
    ];

    /// The label's name as policies write it.
    pub const fn name(self) -> &'static str {
        match self {
            Label::Pii => "pii",
            Label::PiiEmail => "pii:email",
            Label::PiiPhone => "pii:phone",
            Label::PiiIban => "pii:iban",
            Label::PiiCard => "pii:card",
            Label::PiiNationalId => "pii:national-id",
            Label::SizeSmall => "size:small",
            Label::SizeMedium => "size:medium",
            Label::SizeLarge => "size:large",
        }
    }

    /// The label with this name, if it is a classifier label.
    pub fn from_name(name: &str) -> Option<Label> {
        Label::ALL.into_iter().find(|l| l.name() == name)
    }

    const fn bit(self) -> u16 {
        1 << self as u16
    }
}

impl fmt::Display for Label {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of classifier labels.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Labels(u16);

impl Labels {
    /// The empty set.
    pub const EMPTY: Labels = Labels(0);

    /// Adds a label.
    pub fn insert(&mut self, label: Label) {
        self.0 |= label.bit();
    }

    /// Whether the set holds `label`.
    pub const fn has(self, label: Label) -> bool {
        self.0 & label.bit() != 0
    }

    /// Whether the set holds the label named `name`; false for names that are not
    /// classifier labels (a client's own labels live elsewhere).
    pub fn contains(self, name: &str) -> bool {
        Label::from_name(name).is_some_and(|l| self.has(l))
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The labels in the set, in bit order.
    pub fn iter(self) -> impl Iterator<Item = Label> {
        Label::ALL.into_iter().filter(move |l| self.has(*l))
    }

    /// The names of the labels in the set, in bit order.
    pub fn iter_names(self) -> impl Iterator<Item = &'static str> {
        self.iter().map(Label::name)
    }
}

impl FromIterator<Label> for Labels {
    fn from_iter<I: IntoIterator<Item = Label>>(iter: I) -> Self {
        let mut set = Labels::EMPTY;
        for l in iter {
            set.insert(l);
        }
        set
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter_names()).finish()
    }
}

impl fmt::Display for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, name) in self.iter_names().enumerate() {
            if k > 0 {
                f.write_str(",")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for l in Label::ALL {
            assert_eq!(Label::from_name(l.name()), Some(l));
        }
        assert_eq!(Label::from_name("pii:ssn"), None);
    }

    #[test]
    fn set_ops() {
        let set: Labels = [Label::PiiEmail, Label::Pii, Label::SizeSmall]
            .into_iter()
            .collect();
        assert!(set.contains("pii") && set.contains("pii:email") && set.contains("size:small"));
        assert!(!set.contains("pii:phone") && !set.contains("vip"));
        assert_eq!(
            set.iter_names().collect::<Vec<_>>(),
            ["pii", "pii:email", "size:small"]
        );
        assert_eq!(set.to_string(), "pii,pii:email,size:small");
        assert!(Labels::EMPTY.is_empty() && !set.is_empty());
    }
}
