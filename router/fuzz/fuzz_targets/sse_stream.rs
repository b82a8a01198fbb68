//! Fuzzes the SSE parser: no input may panic, and feeding the bytes in arbitrary pieces gives
//! the same events as feeding them at once. Every event is then classified as a worker chunk
//! and pushed through the Anthropic stream translator.
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
        if let openai::StreamItem::Chunk { json, .. } = openai::inspect_chunk(&event.data) {
            let _ = translator.on_chunk(&json);
        }
    }
    let _ = translator.finish();
});
