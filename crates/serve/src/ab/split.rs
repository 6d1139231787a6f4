//! How an A/B run divides requests between its two arms.
//!
//! A [`Split`] sends a share of the requests to the candidate arm, deciding each one
//! by a stable hash: of the request's id (`by = request`: an even random split), of its
//! stream (`by = stream`: every request of a stream goes to the same arm), or of a key
//! the client sends (`by = key`: the `x-yardmaster-key` header, e.g. a tenant, so a
//! tenant's requests all land on one arm; requests without the header are split by id).
//! The same input always lands on the same arm for the same share.

use serde::{Deserialize, Serialize};

/// The request header whose value is the split key of `by = key`.
pub const KEY_HEADER: &str = "x-yardmaster-key";

/// What the split hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum SplitBy {
    /// Each request on its own (by its id).
    #[default]
    Request,
    /// The request's stream.
    Stream,
    /// The client's key ([`KEY_HEADER`]); requests without one by id.
    Key,
}

impl std::str::FromStr for SplitBy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "request" => Ok(Self::Request),
            "stream" => Ok(Self::Stream),
            "key" => Ok(Self::Key),
            other => Err(format!("unknown split {other:?} (request, stream, key)")),
        }
    }
}

/// The candidate arm's share of requests, and what decides each request's arm.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Split {
    /// Share of requests (and of workers) the candidate arm gets, in (0, 1).
    pub candidate_share: f64,
    /// What is hashed.
    #[serde(default)]
    pub by: SplitBy,
}

impl Split {
    /// A split, refused with the reason when the share is not strictly between 0 and 1.
    pub fn new(candidate_share: f64, by: SplitBy) -> Result<Self, String> {
        if !(candidate_share > 0.0 && candidate_share < 1.0) {
            return Err(format!("the candidate's share must be between 0 and 1 (exclusive), not {candidate_share}"));
        }
        Ok(Self { candidate_share, by })
    }

    /// Whether the request goes to the candidate arm.
    pub fn to_candidate(&self, id: u64, stream: u32, key: Option<u64>) -> bool {
        let input = match (self.by, key) {
            (SplitBy::Stream, _) => u64::from(stream) ^ 0x5354_5245_414d,
            (SplitBy::Key, Some(key)) => key,
            _ => id,
        };
        // The top 53 bits as a uniform number in [0, 1).
        let unit = (mix(input) >> 11) as f64 / (1u64 << 53) as f64;
        unit < self.candidate_share
    }

    /// The split in words, e.g. `30 % to the candidate, by request`.
    pub fn describe(&self) -> String {
        let by = match self.by {
            SplitBy::Request => "request",
            SplitBy::Stream => "stream",
            SplitBy::Key => "key",
        };
        format!("{:.0} % to the candidate, by {by}", self.candidate_share * 100.0)
    }
}

/// Hash a client's key (the header's bytes) for [`Split::to_candidate`].
pub fn key_hash(key: &[u8]) -> u64 {
    // FNV-1a, then the finaliser: stable across runs and builds.
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(hash)
}

/// The SplitMix64 finaliser: spreads consecutive inputs over the whole range.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_by_request_keeps_its_proportion() {
        for share in [0.1, 0.3, 0.5, 0.9] {
            let split = Split::new(share, SplitBy::Request).unwrap();
            let n = 100_000;
            let to_b = (1..=n).filter(|&id| split.to_candidate(id, 0, None)).count() as f64 / n as f64;
            assert!((to_b - share).abs() < 0.01, "share {share}: {to_b}");
        }
    }

    #[test]
    fn a_split_by_key_or_stream_is_stable() {
        let split = Split::new(0.5, SplitBy::Key).unwrap();
        let tenant = key_hash(b"tenant-42");
        let first = split.to_candidate(1, 0, Some(tenant));
        assert!((2..500).all(|id| split.to_candidate(id, 3, Some(tenant)) == first), "one key, one arm");
        let arms: std::collections::BTreeSet<bool> =
            (0..64).map(|t| split.to_candidate(1, 0, Some(key_hash(format!("tenant-{t}").as_bytes())))).collect();
        assert_eq!(arms.len(), 2, "different keys reach both arms");
        let by_stream = Split::new(0.5, SplitBy::Stream).unwrap();
        let arm = by_stream.to_candidate(1, 7, None);
        assert!((2..500).all(|id| by_stream.to_candidate(id, 7, Some(id)) == arm), "one stream, one arm");
    }

    #[test]
    fn shares_outside_the_open_interval_are_refused() {
        for share in [0.0, 1.0, -0.5, 1.5, f64::NAN] {
            assert!(Split::new(share, SplitBy::Request).is_err(), "{share}");
        }
        assert_eq!("stream".parse::<SplitBy>(), Ok(SplitBy::Stream));
        assert!("tenant".parse::<SplitBy>().unwrap_err().contains("request, stream, key"));
    }
}
