//! HTTP body compression, as Triton's HTTP clients use it: a request body sent with
//! `Content-Encoding: gzip` or `deflate` (zlib, RFC 1950, as HTTP's `deflate` means
//! and as tritonclient's `request_compression_algorithm` sends it) is inflated before
//! it is read, and a response is compressed with the first of gzip and deflate that
//! the request's `Accept-Encoding` accepts (tritonclient's
//! `response_compression_algorithm`).
//!
//! Inflating is bounded: a body that inflates past the server's body limit is refused
//! (413) as soon as it passes it, so a small compressed body cannot make the server
//! hold an unbounded one. A corrupt body, or an encoding other than these, is refused
//! with the reason.

use std::io::{Read, Write};

use bytes::Bytes;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};
use flate2::Compression;
use http::{HeaderMap, HeaderValue, StatusCode};

/// A body encoding this server reads and writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// `gzip` (RFC 1952).
    Gzip,
    /// `deflate`: zlib-wrapped deflate (RFC 1950).
    Deflate,
}

impl Encoding {
    /// Its token in `Content-Encoding` and `Accept-Encoding`.
    pub fn token(self) -> &'static str {
        match self {
            Encoding::Gzip => "gzip",
            Encoding::Deflate => "deflate",
        }
    }

    fn from_token(token: &str) -> Option<Encoding> {
        match token.trim().to_ascii_lowercase().as_str() {
            "gzip" | "x-gzip" => Some(Encoding::Gzip),
            "deflate" => Some(Encoding::Deflate),
            _ => None,
        }
    }
}

/// Why a request body could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    /// 400 (corrupt), 413 (too large once inflated) or 415 (an unknown encoding).
    pub status: StatusCode,
    /// What was wrong.
    pub reason: String,
}

/// The body as sent before `Content-Encoding` was applied (the body itself when none
/// or `identity`), at most `limit` bytes.
pub fn decode_request_body(headers: &HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, BodyError> {
    let Some(value) = headers.get(http::header::CONTENT_ENCODING) else { return Ok(body) };
    let value = value.to_str().map_err(|_| unsupported("a Content-Encoding that is not text"))?;
    // Encodings apply in the order listed: undo them last first.
    let mut body = body;
    for token in value.split(',').map(str::trim).filter(|t| !t.is_empty()).rev() {
        if token.eq_ignore_ascii_case("identity") {
            continue;
        }
        let encoding = Encoding::from_token(token)
            .ok_or_else(|| unsupported(&format!("Content-Encoding {token:?} (this server reads gzip and deflate)")))?;
        body = inflate(encoding, &body, limit, json_length(headers))?;
    }
    Ok(body)
}

/// The `Inference-Header-Content-Length` of a request: the JSON part of its inflated body.
fn json_length(headers: &HeaderMap) -> usize {
    headers.get(super::kserve::HEADER_CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

fn unsupported(what: &str) -> BodyError {
    BodyError { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, reason: format!("unsupported {what}") }
}

/// Inflate `body`, at most `limit` bytes. The output is placed so that its byte `lead`
/// (where an inference request's binary data starts) is aligned for 8-byte elements
/// where the allocator aligns the buffer so (it does on the supported targets): its
/// tensors are then read in place, not copied again.
fn inflate(encoding: Encoding, body: &[u8], limit: usize, lead: usize) -> Result<Bytes, BodyError> {
    let reader: Box<dyn Read + '_> = match encoding {
        Encoding::Gzip => Box::new(GzDecoder::new(body)),
        Encoding::Deflate => Box::new(ZlibDecoder::new(body)),
    };
    let pad = (8 - lead % 8) % 8;
    let mut out = Vec::with_capacity(pad + body.len().saturating_mul(4).min(limit));
    out.resize(pad, 0);
    // One byte past the limit tells "at the limit" from "over it".
    let read = reader.take(limit as u64 + 1).read_to_end(&mut out);
    if let Err(error) = read {
        return Err(BodyError {
            status: StatusCode::BAD_REQUEST,
            reason: format!("the {} request body could not be decompressed: {error}", encoding.token()),
        });
    }
    if out.len() - pad > limit {
        return Err(BodyError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            reason: format!("the {} request body inflates past the limit of {limit} bytes", encoding.token()),
        });
    }
    Ok(Bytes::from(out).slice(pad..))
}

/// The encoding to answer a request with `headers` in: the first of gzip and deflate,
/// in the client's order of preference (`q` values; a `q=0` excludes one), that its
/// `Accept-Encoding` names. `None` when it names neither (or `*` alone: identity is as
/// good an answer).
pub fn response_encoding(headers: &HeaderMap) -> Option<Encoding> {
    let accept = headers.get(http::header::ACCEPT_ENCODING)?.to_str().ok()?;
    let mut offered: Vec<(f32, usize, Encoding)> = Vec::new();
    for (order, item) in accept.split(',').enumerate() {
        let mut parts = item.split(';');
        let Some(encoding) = parts.next().and_then(Encoding::from_token) else { continue };
        let q = parts.filter_map(|p| p.trim().strip_prefix("q=")).find_map(|q| q.trim().parse::<f32>().ok()).unwrap_or(1.0);
        if q > 0.0 {
            offered.push((q, order, encoding));
        }
    }
    offered.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    offered.first().map(|(_, _, encoding)| *encoding)
}

/// Compress a response body with `encoding` and mark it so (`Content-Encoding`; the
/// transport sets `Content-Length` from the new body).
pub fn encode_response_body(encoding: Encoding, headers: &mut HeaderMap, body: &[u8]) -> Bytes {
    let compressed = match encoding {
        Encoding::Gzip => {
            let mut writer = GzEncoder::new(Vec::with_capacity(body.len() / 2), Compression::fast());
            writer.write_all(body).and_then(|()| writer.finish())
        }
        Encoding::Deflate => {
            let mut writer = ZlibEncoder::new(Vec::with_capacity(body.len() / 2), Compression::fast());
            writer.write_all(body).and_then(|()| writer.finish())
        }
    };
    let compressed = compressed.expect("writing into memory does not fail");
    headers.insert(http::header::CONTENT_ENCODING, HeaderValue::from_static(encoding.token()));
    headers.append(http::header::VARY, HeaderValue::from_static("accept-encoding"));
    Bytes::from(compressed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: http::header::HeaderName, value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(name, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn gzip_and_deflate_bodies_read_back_and_bad_ones_are_refused_with_the_reason() {
        let text = br#"{"inputs":[{"name":"x","shape":[1,4],"datatype":"FP32","data":[1,2,3,4]}]}"#.repeat(20);
        for encoding in [Encoding::Gzip, Encoding::Deflate] {
            let mut headers = HeaderMap::new();
            let compressed = encode_response_body(encoding, &mut headers, &text);
            assert!(compressed.len() < text.len());
            let request = with(http::header::CONTENT_ENCODING, encoding.token());
            assert_eq!(decode_request_body(&request, compressed.clone(), 1 << 20).unwrap(), Bytes::from(text.clone()));
            let small = decode_request_body(&request, compressed, 100).unwrap_err();
            assert_eq!(small.status, StatusCode::PAYLOAD_TOO_LARGE, "{small:?}");
            let corrupt = decode_request_body(&request, Bytes::from_static(b"not compressed at all"), 1 << 20).unwrap_err();
            assert_eq!(corrupt.status, StatusCode::BAD_REQUEST);
            assert!(corrupt.reason.contains(encoding.token()) && corrupt.reason.contains("decompressed"), "{corrupt:?}");
        }
        let brotli = decode_request_body(&with(http::header::CONTENT_ENCODING, "br"), Bytes::new(), 10).unwrap_err();
        assert_eq!(brotli.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(brotli.reason.contains("\"br\""), "{brotli:?}");
        let plain = Bytes::from_static(b"{}");
        assert_eq!(decode_request_body(&with(http::header::CONTENT_ENCODING, "identity"), plain.clone(), 10).unwrap(), plain);
        assert_eq!(decode_request_body(&HeaderMap::new(), plain.clone(), 10).unwrap(), plain);
    }

    #[test]
    fn an_inflated_inference_body_has_its_binary_data_aligned() {
        for lead in [0usize, 1, 5, 13] {
            let body: Vec<u8> = (0..lead + 64).map(|i| i as u8).collect();
            let mut headers = with(http::header::CONTENT_ENCODING, "gzip");
            let compressed = encode_response_body(Encoding::Gzip, &mut HeaderMap::new(), &body);
            headers.insert(crate::kserve::HEADER_CONTENT_LENGTH, HeaderValue::from(lead));
            let inflated = decode_request_body(&headers, compressed, 1 << 20).unwrap();
            assert_eq!(&inflated[..], &body[..]);
            assert!((inflated[lead..].as_ptr() as usize).is_multiple_of(8), "binary data after {lead} bytes of JSON");
        }
    }

    #[test]
    fn the_response_takes_the_clients_preferred_encoding() {
        let accept = |value: &str| response_encoding(&with(http::header::ACCEPT_ENCODING, value));
        assert_eq!(accept("gzip"), Some(Encoding::Gzip));
        assert_eq!(accept("deflate"), Some(Encoding::Deflate));
        assert_eq!(accept("br, deflate, gzip"), Some(Encoding::Deflate));
        assert_eq!(accept("gzip;q=0.5, deflate;q=0.9"), Some(Encoding::Deflate));
        assert_eq!(accept("gzip;q=0, identity"), None);
        assert_eq!(accept("*"), None);
        assert_eq!(response_encoding(&HeaderMap::new()), None);
    }
}
