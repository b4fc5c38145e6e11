//! The `frame_decode` target.

use crate::prelude::*;

/// Decodes `data` as a text message and as a binary message, and builds a
/// frame from it: no panic; every frame that decodes re-encodes and decodes
/// to the same value; a decoded chunk re-encodes to the same bytes; every
/// error names a close code (1009 only for a message over the limit).
pub fn frame_decode(data: &[u8]) {
    // As a text message.
    let text = String::from_utf8_lossy(data);
    let res = frame::decode_text(&text);
    check_decoded(&res, text.len());
    check_headers_against_value(&text, &res);
    // The fast scanner tried first must give the serde path's answer.
    assert_eq!(res, frame::decode_text_reference(&text, None), "{text}");
    let limits = frame::HeadLimits::default();
    assert_eq!(
        frame::decode_text_limited(&text, &limits),
        frame::decode_text_reference(&text, Some(&limits)),
        "{text}"
    );
    if let Ok(d) = &res {
        if let Some(msg) = d.to_message() {
            assert_eq!(frame::decode(&msg).expect("a data message").as_ref(), Ok(d));
        }
    }

    // As a binary message.
    let bytes = Bytes::copy_from_slice(data);
    let res = frame::decode_binary(bytes.clone());
    check_decoded(&res, bytes.len());
    match &res {
        Ok(Decoded::Chunk(ch)) => {
            assert_eq!(ch.encode(), bytes, "a chunk re-encodes to its bytes");
            assert_eq!(ch.data.len() + 4, data.len());
            assert!(ch.data.len() <= MAX_CHUNK_BODY);
            let msg = Message::Binary(bytes.clone());
            assert_eq!(frame::decode(&msg), Some(Ok(Decoded::Chunk(ch.clone()))));
        }
        Ok(other) => panic!("a binary message decoded to {other:?}"),
        Err(_) => {}
    }

    // As the recipe of a frame: encode, decode, compare.
    let mut c = Cursor::new(data);
    let id = StreamId::new(c.u32()).unwrap_or(StreamId::MIN);
    let frame = match c.u8() % 4 {
        0 => ControlFrame::Request {
            id,
            head: gen_request_head(&mut c),
        },
        1 => ControlFrame::Response {
            id,
            head: gen_response_head(&mut c),
        },
        2 => ControlFrame::End { id },
        _ => ControlFrame::Abort { id },
    };
    let enc = frame.encode();
    assert_eq!(
        frame::decode_text(&enc),
        Ok(Decoded::Control(frame.clone())),
        "{enc}"
    );
    let chunk = frame::Chunk {
        id,
        data: Bytes::copy_from_slice(c.bytes(usize::MAX)),
    };
    assert_eq!(
        frame::decode_binary(chunk.encode()),
        Ok(Decoded::Chunk(chunk))
    );
}

/// The differential check of issue 28: a head's headers, decoded straight
/// into one buffer, are the pairs `serde_json::Value` reads from the text.
fn check_headers_against_value(text: &str, res: &Result<Decoded, FrameError>) {
    let head_headers = match res {
        Ok(Decoded::Control(ControlFrame::Request { head, .. })) => head.headers(),
        Ok(Decoded::Control(ControlFrame::Response { head, .. })) => head.headers(),
        _ => return,
    };
    // Value refuses what the decoder skips unread (a lone surrogate escape in
    // an unknown field): only a text both read is compared.
    let Ok(v) = serde_json::from_str::<serde_json::Value>(text) else {
        return;
    };
    let expected: Vec<(String, String)> = match v.get("headers") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(list) => list
            .as_array()
            .expect("decoded headers are a list")
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([serde_json::Value::String(n), serde_json::Value::String(v)]) => {
                    (n.clone(), v.clone())
                }
                other => panic!("a decoded header pair is {other:?}"),
            })
            .collect(),
    };
    assert_eq!(head_headers.clone().into_vec(), expected, "{text}");
}

pub(crate) fn check_decoded(res: &Result<Decoded, FrameError>, len: usize) {
    match res {
        Ok(Decoded::Control(c)) => {
            assert!(len <= MAX_MESSAGE_LEN);
            let enc = c.encode();
            assert_eq!(
                frame::decode_text(&enc),
                Ok(Decoded::Control(c.clone())),
                "re-encoded as {enc}"
            );
            assert_eq!(c.encode(), enc, "encoding is deterministic");
            assert_eq!(c.to_message(), Message::Text(enc));
            let headers = match c {
                ControlFrame::Request { head, .. } => {
                    assert!(head.path().starts_with('/'));
                    assert!(head.target().starts_with(head.path()));
                    Some(head.headers())
                }
                ControlFrame::Response { head, .. } => {
                    assert!((100..=999).contains(&head.status()));
                    Some(head.headers())
                }
                _ => None,
            };
            if let Some(h) = headers {
                // Every value is Latin-1: `iter_raw` must not panic, and the
                // bytes decode back to the same text.
                for ((n, v), (rn, rv)) in h.iter().zip(h.iter_raw()) {
                    assert_eq!(n.as_bytes(), rn);
                    assert_eq!(rv.iter().map(|&b| char::from(b)).collect::<String>(), v);
                    assert!(frame::check_header(n, v, 0).is_ok());
                }
                let _ = h.content_length();
                let kept = h.without_hop_by_hop();
                assert!(kept.iter().all(|(n, _)| !frame::is_hop_by_hop_name(n)));
            }
        }
        Ok(Decoded::Chunk(_)) | Ok(Decoded::Unknown) => {}
        Ok(other) => panic!("a decoded value this harness does not know: {other:?}"),
        Err(e) => {
            let code = e.close_code();
            let too_large = matches!(e, FrameError::TooLarge { .. });
            assert_eq!(code == CloseCode::MESSAGE_TOO_BIG, too_large, "{e:?}");
            assert_eq!(too_large, len > MAX_MESSAGE_LEN, "{e:?} for {len} bytes");
            assert!(
                [1002, 1007, 1009].contains(&code.0),
                "{e:?} closes with {code:?}"
            );
            assert!(!e.kind().is_empty());
            assert!(!e.to_string().is_empty());
        }
    }
}
