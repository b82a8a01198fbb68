#!/usr/bin/env python3
"""Writes testdata/pii/labelled.jsonl: the labelled set the PII labeller is scored on.

Every value is synthetic: names from short lists, example domains, and numbers drawn from a
seeded RNG with their check digits computed here (Luhn, IBAN MOD 97-10, BSN 11-proof, DNI/NIE
letter, NIR key, Steuer-IdNr MOD 11,10), so no real person's data is in the set. The set
holds positives of every kind and country in several formats, hard negatives (dates, times,
versions, ISBNs, UUIDs, hashes, order numbers, token ids, code, invalid checksums) and, on
purpose, a few cases the labeller is known to get wrong, so the figures are honest.

    python3 testdata/pii/gen_labelled.py > testdata/pii/labelled.jsonl

Deterministic: the same script writes the same file.
"""
import json
import random

R = random.Random(13)

FIRST = ["jane", "john", "maria", "lucas", "emma", "noah", "sofia", "liam", "ana", "yuki",
         "omar", "chloe", "pieter", "ines", "tomas", "lea"]
LAST = ["doe", "smith", "garcia", "jansen", "muller", "martin", "rossi", "silva", "kowalski",
        "tanaka", "dubois", "devries", "novak", "lopez"]
DOMAINS = ["example.com", "example.org", "example.net", "mail.example.com", "corp.example.co.uk",
           "example.de", "example.nl", "example.fr", "example.es", "uni.example.edu"]

out = []


def add(text, labels, note):
    labels = sorted(set(labels))
    if labels:
        labels = sorted(set(labels) | {"pii"})
    out.append({"text": text, "labels": labels, "note": note})


def digits(n):
    return "".join(R.choice("0123456789") for _ in range(n))


# ---- e-mail ---------------------------------------------------------------------------
EMAIL_TEMPLATES = [
    "Please send the report to {e} before Friday.",
    "Contact: {e}",
    "From: {name} <{e}>",
    "my email is {e}, thanks",
    "cc {e} on the ticket",
    "Reply-To: {e}\nSubject: invoice",
    "Summarise this thread. The customer ({e}) asked for a refund twice.",
    "Translate to French: 'Write to {e} if you have questions.'",
]


def email():
    f, l = R.choice(FIRST), R.choice(LAST)
    local = R.choice([f"{f}.{l}", f"{f}{l[0]}", f"{f}_{l}{R.randint(1, 99)}", f"{f}+news",
                      f"{f[0]}.{l}", f"{l}{R.randint(1970, 2005)}"])
    if R.random() < 0.15:
        local = local.capitalize()
    return local + "@" + R.choice(DOMAINS)


for k in range(44):
    e = email()
    t = EMAIL_TEMPLATES[k % len(EMAIL_TEMPLATES)]
    add(t.format(e=e, name=R.choice(FIRST).title()), ["pii:email"], "e-mail")

for text, note in [
    ("Use the retina asset logo@2x.png and icon@3x.svg in the header.", "asset names"),
    ("npm install left-pad@1.3.0 react@18.2.0", "package versions"),
    ("Thanks @maria for the review! cc @john", "mentions"),
    ("@property\ndef name(self):\n    return self._name", "python decorator"),
    ("Connect with ssh to admin@localhost or root@127.0.0.1.", "no public domain"),
    ("The regex [a-z]+@[a-z]+\\.[a-z]{2,} matches simple addresses.", "regex source"),
    ("The @ sign is called 'at' and 'arroba'.", "the sign alone"),
    ("Install it with pip install 'pkg @ git+https://example.com/repo.git'.", "pip direct reference"),
    ("Emails are stored as local-part @ domain with a max of 254 chars.", "prose about email"),
    ("docker pull registry.example.com/app@sha256:9f86d081884c7d659a2feaa0c55ad015", "image digest"),
]:
    add(text, [], note)
# Known error cases, kept on purpose.
add("write to jane dot doe at example dot com", ["pii:email"], "obfuscated address (known miss)")
add("git clone git@github.com:example/repo.git", [], "ssh remote, not a person (known false alarm)")
add("Write to JANE.DOE@EXAMPLE.COM or jane.doe(at)example.com", ["pii:email"], "upper case address")

# ---- phones ---------------------------------------------------------------------------
PHONE_TEMPLATES = [
    "Call me on {p} after 6pm.",
    "Phone: {p}",
    "You can reach the driver at {p}.",
    "tel {p} (office)",
    "WhatsApp {p}",
    "Mobile: {p}\nAddress: 1 Main Street",
    "Rewrite politely: 'ring {p} now or we cancel'",
]


def nanp():
    a = f"{R.randint(2, 9)}{digits(2)}"
    x = f"{R.randint(2, 9)}{digits(2)}"
    s = digits(4)
    return R.choice([f"({a}) {x}-{s}", f"{a}-{x}-{s}", f"{a}.{x}.{s}", f"+1 {a} {x} {s}",
                     f"+1-{a}-{x}-{s}", f"1 {a} {x} {s}"])


def intl():
    cc, fmt = R.choice([
        ("44", lambda: f"20 {digits(4)} {digits(4)}"),
        ("44", lambda: f"7{digits(3)} {digits(6)}"),
        ("31", lambda: f"6 {digits(8)}"),
        ("31", lambda: f"20 {digits(3)} {digits(4)}"),
        ("33", lambda: f"6 {digits(2)} {digits(2)} {digits(2)} {digits(2)}"),
        ("49", lambda: f"30 {digits(8)}"),
        ("49", lambda: f"151 {digits(8)}"),
        ("34", lambda: f"6{digits(2)} {digits(3)} {digits(3)}"),
        ("39", lambda: f"3{digits(2)} {digits(7)}"),
        ("81", lambda: f"90-{digits(4)}-{digits(4)}"),
    ])
    body = fmt()
    return R.choice([f"+{cc} {body}", f"+{cc}{body.replace(' ', '').replace('-', '')}",
                     f"00{cc} {body}"])


def national():
    return R.choice([
        lambda: f"020 {digits(4)} {digits(4)}",           # UK London
        lambda: f"07{digits(3)} {digits(6)}",             # UK mobile
        lambda: f"06-{digits(8)}",                        # NL mobile
        lambda: f"020-{digits(7)}",                       # NL Amsterdam
        lambda: f"0{R.randint(1, 7)} {digits(2)} {digits(2)} {digits(2)} {digits(2)}",  # FR
        lambda: f"0{R.randint(1, 7)}.{digits(2)}.{digits(2)}.{digits(2)}.{digits(2)}",  # FR dots
        lambda: f"030 {digits(8)}",                       # DE Berlin
        lambda: f"0151 {digits(8)}",                      # DE mobile
        lambda: f"089/{digits(7)}",                       # DE Munich
        lambda: f"6{digits(2)} {digits(2)} {digits(2)} {digits(2)}",  # ES mobile
        lambda: f"91 {digits(3)} {digits(2)} {digits(2)}",             # ES Madrid
    ])()


for k in range(24):
    add(PHONE_TEMPLATES[k % len(PHONE_TEMPLATES)].format(p=nanp()), ["pii:phone"], "phone NANP")
for k in range(24):
    add(PHONE_TEMPLATES[k % len(PHONE_TEMPLATES)].format(p=intl()), ["pii:phone"], "phone international")
for k in range(30):
    add(PHONE_TEMPLATES[k % len(PHONE_TEMPLATES)].format(p=national()), ["pii:phone"], "phone national")
add("phone 0612345678", ["pii:phone"], "unseparated with keyword")
add("telefoon: 0201234567", ["pii:phone"], "unseparated with Dutch keyword")
# Known misses: bare national numbers without separators or context.
add("ok so 4155550123 is the number", ["pii:phone"], "bare 10 digits, no context (known miss)")
add("Text 0612345678 when you arrive", ["pii:phone"], "bare mobile, verb 'text' (known miss)")

for text, note in [
    ("The meeting is on 2024-06-15 at 14:30 UTC.", "ISO date and time"),
    ("Deadline: 15/06/2024, then 01/07/2024.", "dd/mm/yyyy dates"),
    ("Logged at 01.02.2024 10:30:15 by the scheduler.", "dotted date and time"),
    ("Windows 10.0.19045.2006 and kernel 6.8.0-45-generic", "version numbers"),
    ("Server 192.168.100.200 and 10.0.0.1 answer on port 8080.", "IP addresses"),
    ("Order 1234567890 shipped on 2024-05-01; tracking 00340434161094042557.", "order and tracking numbers"),
    ("Unix time 1700000000 is in November 2023.", "timestamp"),
    ("input_ids: [151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13]", "token ids"),
    ("0 151644 8948 198 2610 525 264 10950", "token ids space separated"),
    ("ISBN 978-3-16-148410-0 and ISBN-10 0-306-40615-2", "ISBNs"),
    ("Population grew from 1 234 567 to 2 345 678 between 1990 and 2020.", "grouped counts"),
    ("Coordinates 52.3702, 4.8952 and 40.7128, -74.0060", "coordinates"),
    ("pi = 3.14159265358979 and e = 2.71828182845904", "constants"),
    ("Screen 1920x1080, 2560x1440 at 144 Hz", "resolutions"),
    ("Rooms 101-102 and 201-205 are booked 09:00-17:30.", "ranges"),
    ("Invoice INV-2024-000123 due 2024-07-01, amount 1,234.56 EUR", "invoice number"),
    ("Call stack depth 12 at line 345 of 6789 lines.", "'call' with small numbers"),
    ("Fibonacci: 1 1 2 3 5 8 13 21 34 55 89 144", "number sequence"),
    ("Matrix [[12, 34], [56, 78]] times 2024", "matrix"),
    ("PO box 4500-0012-0034 ref 2024/06/15", "PO reference"),
    ("Build 20240615.3 of release 2024.06", "build numbers"),
    ("Lat/long 51.5074/-0.1278", "lat/long"),
    ("Uptime 123:45:06, load 0.52 0.58 0.59", "uptime"),
    ("Part number 06.12.34.56.78.90.12 in the catalogue", "dotted part number"),
]:
    add(text, [], note)
add("Ref 0201 2345 6789 in the ledger", [], "trunk-like reference (known false alarm)")
add("The call took 1234567 ms to return.", [], "'call' before a duration (known false alarm)")

# ---- IBAN -----------------------------------------------------------------------------
IBAN_FORMATS = {  # country: (length, BBAN pattern: n digit, a upper letter, c alnum)
    "NL": "aaaannnnnnnnnn", "DE": "nnnnnnnnnnnnnnnnnn", "GB": "aaaannnnnnnnnnnnnn",
    "FR": "nnnnnnnnnnnnnnnnnnnnnnn", "ES": "nnnnnnnnnnnnnnnnnnnn", "BE": "nnnnnnnnnnnn",
    "IT": "a" + "n" * 10 + "c" * 12, "CH": "n" * 5 + "c" * 12, "AT": "nnnnnnnnnnnnnnnn",
    "PL": "nnnnnnnnnnnnnnnnnnnnnnnn", "IE": "aaaannnnnnnnnnnnnn", "PT": "nnnnnnnnnnnnnnnnnnnnn",
}


def iban_value(s):
    return int("".join(str(int(c, 36)) for c in s))


def iban(cc):
    pat = IBAN_FORMATS[cc]
    bban = "".join(R.choice("0123456789") if p == "n" else
                   R.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") if p == "a" else
                   R.choice("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") for p in pat)
    check = 98 - iban_value(bban + cc + "00") % 97
    return f"{cc}{check:02d}{bban}"


def grouped(s):
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4))


IBAN_TEMPLATES = [
    "Please transfer the deposit to {i}.",
    "IBAN: {i}",
    "Bank account {i} (name: J. Doe)",
    "Zahlung an {i} bis Montag",
    "Rekeningnummer {i}",
    "Wire to iban {i} with reference 2024-17",
]
for k in range(40):
    cc = list(IBAN_FORMATS)[k % len(IBAN_FORMATS)]
    v = iban(cc)
    form = grouped(v) if k % 3 != 2 else v
    add(IBAN_TEMPLATES[k % len(IBAN_TEMPLATES)].format(i=form), ["pii:iban"], f"IBAN {cc}")
for k in range(14):
    cc = list(IBAN_FORMATS)[k % len(IBAN_FORMATS)]
    v = iban(cc)
    bad = v[:2] + f"{(int(v[2:4]) + 1 + k % 7) % 100:02d}" + v[4:]
    if bad != v:
        add(f"IBAN: {grouped(bad)}", [], f"IBAN {cc} with wrong check digits")
add("Code XX12 3456 7890 1234 56 is not a country", [], "unknown country")
add("NL91ABNA04171643", [], "IBAN too short")
add("Serial GB12ABCD12345612345678 on the label", [], "IBAN-shaped serial, bad checksum")
add("iban nl91 abna 0417 1643 00 (lower case)", ["pii:iban"], "lower-case IBAN")

# ---- cards ----------------------------------------------------------------------------
def luhn_complete(prefix, length):
    body = prefix + digits(length - len(prefix) - 1)
    total = 0
    for k, c in enumerate(reversed(body)):
        d = int(c)
        if k % 2 == 0:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return body + str((10 - total % 10) % 10)


CARD_KINDS = [
    ("Visa", lambda: "4", 16), ("Visa", lambda: "4", 16), ("Mastercard", lambda: str(R.randint(51, 55)), 16),
    ("Mastercard 2-series", lambda: str(R.randint(2221, 2720)), 16), ("Amex", lambda: R.choice(["34", "37"]), 15),
    ("Discover", lambda: "6011", 16), ("JCB", lambda: str(R.randint(3528, 3589)), 16),
    ("Diners", lambda: "36", 14), ("UnionPay", lambda: "62", 16), ("Visa 19", lambda: "4", 19),
]


def card_format(num):
    style = R.randint(0, 2)
    if style == 0:
        return num
    sep = " " if style == 1 else "-"
    if len(num) == 15:
        return sep.join([num[:4], num[4:10], num[10:]])
    if len(num) == 14:
        return sep.join([num[:4], num[4:10], num[10:]])
    return sep.join(num[i:i + 4] for i in range(0, len(num), 4))


CARD_TEMPLATES = [
    "My card number is {c}, expiry 09/27.",
    "Charge {c} for the upgrade.",
    "card: {c} cvv 123",
    "Customer paid with {c} yesterday; refund it.",
    "Kreditkarte {c}",
]
for k in range(40):
    name, pre, length = CARD_KINDS[k % len(CARD_KINDS)]
    num = luhn_complete(pre(), length)
    add(CARD_TEMPLATES[k % len(CARD_TEMPLATES)].format(c=card_format(num)), ["pii:card"], f"card {name}")
for k in range(10):
    name, pre, length = CARD_KINDS[k % len(CARD_KINDS)]
    num = luhn_complete(pre(), length)
    bad = num[:-1] + str((int(num[-1]) + 1 + k % 8) % 10)
    add(f"card {card_format(bad)}", [], f"card {name} failing Luhn")
for k in range(6):
    num = luhn_complete(R.choice(["1", "7", "8", "9"]), 16)
    add(f"Order reference {num} confirmed", [], "Luhn-valid 16 digits, no issuer")
add("Gift code 4111-1111 1111-1111", [], "mixed separators")

# ---- national ids ---------------------------------------------------------------------
def ssn():
    while True:
        area = R.randint(1, 899)
        if area != 666:
            return f"{area:03d}", f"{R.randint(1, 99):02d}", f"{R.randint(1, 9999):04d}"


for k in range(14):
    a, g, s = ssn()
    form = [f"{a}-{g}-{s}", f"{a} {g} {s}", f"SSN {a}{g}{s}"][k % 3]
    text = ["Employee SSN: {x}", "social security number {x} on file", "Verify {x} against the W-2."][k % 3]
    add(text.format(x=form), ["pii:national-id"], "US SSN")
for text in ["Area 666-12-3456 is never issued", "SSN 912-34-5678 is an ITIN range",
             "Form 123-00-4567 is a template"]:
    add(text, [], "SSN shape breaking the rules")
add("Serial 078-05-0000", [], "SSN shape read as a trunk-prefixed phone (known false alarm)")


def bsn():
    while True:
        d = [R.randint(0, 9) for _ in range(8)]
        if d[0] == 0:
            continue
        s = sum((9 - k) * x for k, x in enumerate(d))
        last = s % 11
        if last < 10:
            return "".join(map(str, d + [last]))


for k in range(12):
    b = bsn()
    form = b if k % 4 != 3 else f"{b[:4]}.{b[4:6]}.{b[6:]}"
    text = ["BSN: {x}", "mijn burgerservicenummer is {x}", "BSN {x} van de aanvrager", "sofinummer {x}"][k % 4]
    add(text.format(x=form), ["pii:national-id"], "NL BSN")
b = bsn()
add(f"BSN: {b[:-1]}{(int(b[-1]) + 1) % 10}", [], "BSN failing 11-proof")
add(f"ticket {bsn()} closed", [], "11-proof number without context")
add(f"mijn nummer is {bsn()}", ["pii:national-id"], "BSN without keyword (known miss)")

DNI = "TRWAGMYFPDXBNJZSQVHLCKE"
for k in range(12):
    n = R.randint(10000000, 99999999)
    if k % 3 == 2:
        p = R.randint(0, 2)
        n7 = R.randint(0, 9999999)
        letter = DNI[(p * 10000000 + n7) % 23]
        x = ["X", "Y", "Z"][p] + (f"{n7:07d}{letter}" if k % 2 else f"-{n7:07d}-{letter}")
        add(f"NIE {x}", ["pii:national-id"], "ES NIE")
    else:
        x = f"{n:08d}{DNI[n % 23]}" if k % 2 else f"{n:08d}-{DNI[n % 23]}"
        add(["DNI: {x}", "Documento {x} del titular"][k % 2].format(x=x), ["pii:national-id"], "ES DNI")
n = R.randint(10000000, 99999999)
add(f"DNI {n:08d}{DNI[(n + 1) % 23]}", [], "DNI wrong letter")
add("Model 12345678B of the series", [], "product code, wrong letter")

NINO_FIRST = "ABCEGHJKLMNOPRSTWXYZ"
NINO_SECOND = "ABCEGHJKLMNPRSTWXYZ"
for k in range(12):
    while True:
        p = R.choice(NINO_FIRST) + R.choice(NINO_SECOND)
        if p not in ("BG", "GB", "KN", "NK", "NT", "TN", "ZZ"):
            break
    d = digits(6)
    s = R.choice("ABCD")
    form = [f"{p}{d}{s}", f"{p} {d[:2]} {d[2:4]} {d[4:]} {s}", f"{p}{d} {s}"][k % 3]
    add(["NI number {x}", "National Insurance: {x}", "NINO {x} for payroll"][k % 3].format(x=form),
        ["pii:national-id"], "GB NINO")
add("Ref GB123456A on the form", [], "NINO with a never-issued prefix")
add("Code AB123456E", [], "NINO shape with bad suffix")
add("NI number AB123456", ["pii:national-id"], "NINO without suffix letter (known miss)")


def nir():
    sex = R.choice("12")
    yy = f"{R.randint(0, 99):02d}"
    mm = f"{R.randint(1, 12):02d}"
    dep = f"{R.choice([R.randint(1, 19), R.randint(21, 95)]):02d}"
    com = f"{R.randint(1, 999):03d}"
    order = f"{R.randint(1, 999):03d}"
    base = sex + yy + mm + dep + com + order
    key = 97 - int(base) % 97
    return base, f"{key:02d}"


for k in range(12):
    base, key = nir()
    form = [f"{base[0]} {base[1:3]} {base[3:5]} {base[5:7]} {base[7:10]} {base[10:13]} {key}",
            f"{base}{key}", f"{base} {key}"][k % 3]
    add(["numéro de sécurité sociale {x}", "NIR: {x}", "Carte Vitale {x}"][k % 3].format(x=form),
        ["pii:national-id"], "FR NIR")
base, key = nir()
add(f"NIR {base}{(int(key) % 97) + 1:02d}", [], "NIR wrong key")
add("NIR 2 90 02 2A 123 456 15", ["pii:national-id"], "Corsican NIR (known miss)")


def steuer():
    while True:
        pool = list(range(10))
        R.shuffle(pool)
        first10 = pool[:9]
        first10.insert(R.randint(0, 9), R.choice(first10))
        if first10[0] == 0 or any(first10[i] == first10[i + 1] == first10[i + 2] for i in range(8)):
            continue
        product = 10
        for x in first10:
            s = (x + product) % 10
            if s == 0:
                s = 10
            product = (s * 2) % 11
        check = (11 - product) % 10
        return "".join(map(str, first10 + [check]))


for k in range(12):
    s = steuer()
    form = s if k % 2 else f"{s[:2]} {s[2:5]} {s[5:8]} {s[8:]}"
    add(["Steuer-ID: {x}", "Steuerliche Identifikationsnummer {x}", "IdNr {x}",
         "tax id {x} (Germany)"][k % 4].format(x=form), ["pii:national-id"], "DE Steuer-IdNr")
s = steuer()
add(f"Steuer-ID {s[:-1]}{(int(s[-1]) + 1) % 10}", [], "Steuer-IdNr wrong check digit")
add(f"Artikel {steuer()} im Lager", [], "valid IdNr shape, no context")

# ---- mixed and clean -------------------------------------------------------------------
for k in range(16):
    e = email()
    p = national()
    a, g, s = ssn()
    card = card_format(luhn_complete("4", 16))
    v = grouped(iban("NL"))
    parts = [(f"email {e}", "pii:email"), (f"phone {p}", "pii:phone"), (f"SSN {a}-{g}-{s}", "pii:national-id"),
             (f"card {card}", "pii:card"), (f"IBAN {v}", "pii:iban")]
    R.shuffle(parts)
    chosen = parts[: 2 + k % 3]
    add("Customer record: " + "; ".join(t for t, _ in chosen) + ".", [l for _, l in chosen], "mixed")

for text, note in [
    ("Explain the difference between TCP and UDP in three sentences.", "prose"),
    ("Write a haiku about autumn leaves.", "prose"),
    ("def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(30))", "python"),
    ("```rust\nfn main() {\n    let xs = [1, 2, 3, 4096, 65535];\n    println!(\"{:?}\", xs);\n}\n```", "rust"),
    ("SELECT id, email FROM users WHERE created_at > '2024-01-01' LIMIT 100;", "SQL naming a column"),
    ("{\"id\": 1234567, \"ts\": 1717171717, \"ratio\": 0.125, \"tags\": [\"a\", \"b\"]}", "JSON"),
    ("2024-06-15T14:30:00Z INFO request_id=7f3a9c1e latency_ms=124 status=200", "log line"),
    ("UUID 550e8400-e29b-41d4-a716-446655440000 and 123e4567-e89b-12d3-a456-426614174000", "UUIDs"),
    ("sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "hash"),
    ("md5 d41d8cd98f00b204e9800998ecf8427e, git 3f2a1b7", "hashes"),
    ("color #ff8800 rgb(255, 136, 0) and 0x4111111111111111", "hex literals"),
    ("The model has 70 billion parameters and a 128000 token context.", "model facts"),
    ("Kubernetes 1.33 with 3 nodes, 8 GPUs each, 640 GiB total.", "infra"),
    ("Add 4111 and 1111, then 1111 and 1111.", "arithmetic words"),
    ("Chapter 12, pages 345-678, figure 9.10.", "book references"),
    ("x = [0.12, 0.34, 0.56, 0.78]; y = np.zeros((1024, 768))", "arrays"),
    ("The flight leaves at 06:45 and lands at 09:10 local time.", "times"),
    ("ZIP 94103, postcode 1012 AB, PLZ 10115", "postal codes"),
    ("Temperature range -40 to 125 C, 3.3 V, 20 mA", "datasheet"),
    ("Version 2.0.0-rc.1+build.5 is out.", "semver"),
]:
    add(text, [], note)

for row in out:
    print(json.dumps(row, ensure_ascii=False))
