//! Helpers shared by the golden-fixture tests.

/// The bytes of a hex fixture: `#` lines are comments, every other hex digit counts (spaces
/// and line breaks are layout).
pub fn unhex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::bytes)
        .filter(u8::is_ascii_hexdigit)
        .collect();
    digits
        .chunks(2)
        .map(|p| {
            u8::from_str_radix(std::str::from_utf8(p).expect("hex fixture is ASCII"), 16)
                .expect("hex digits")
        })
        .collect()
}

/// Asserts that `message` encodes to exactly `golden` and decodes back from it.
pub fn assert_golden<M: prost::Message + Default + PartialEq + std::fmt::Debug>(
    message: &M,
    golden: &[u8],
) {
    let bytes = message.encode_to_vec();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        bytes, golden,
        "encoding drifted from the fixture; now:\n{hex}"
    );
    assert_eq!(&M::decode(golden).expect("the fixture decodes"), message);
}
