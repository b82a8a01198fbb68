//! Fuzzes the SSE parser: no input may panic, and feeding the bytes in arbitrary pieces gives
//! the same events as feeding them at once. Every event is then classified as a worker chunk
//! both ways (the relay's one pass and the full parse, which must agree) and pushed through
//! the Anthropic stream translator.
#![no_main]

include!("gateway_wire.rs");

use libfuzzer_sys::fuzz_target;
use sse::SseParser;

fn parse(pieces: &[&[u8]]) -> Result<Vec<sse::SseEvent>, sse::SseError> {
    let mut p = SseParser::new(1 << 16);
    let mut out = Vec::new();
    for piece in pieces {
        p.push(piece, &mut out)?;
    }
    out.extend(p.finish()?);
    Ok(out)
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, body)) = data.split_first() else { return };
    let step = usize::from(step % 7) + 1;
    let whole = parse(&[body]);
    let pieces: Vec<&[u8]> = body.chunks(step).collect();
    let split = parse(&pieces);
    match (&whole, &split) {
        (Ok(a), Ok(b)) => assert_eq!(a, b),
        (Err(_), Err(_)) => {}
        _ => panic!("whole and split parses disagree: {whole:?} vs {split:?}"),
    }
    let mut translator = anthropic::StreamTranslator::new("m");
    for event in whole.unwrap_or_default() {
        let wire = event.encode();
        assert_eq!(parse(&[&wire]).expect("re-encoded event parses"), vec![event.clone()]);
        let (full, json) = openai::inspect_chunk_json(&event.data);
        let fast = openai::inspect_chunk(&event.data);
        // The one-pass reading agrees wherever the full parse accepts the payload; where it
        // does not, only a JSON-object-looking payload may still be metered.
        if full != openai::StreamItem::Other || !event.data.trim().starts_with('{') {
            assert_eq!(fast, full, "{:?}", event.data);
        }
        if let Some(json) = json {
            let _ = translator.on_chunk(&json);
        }
    }
    let _ = translator.finish();
});
