//! A decoder worker: one [`DecoderSession`] and the KV caches of the sequences it
//! serves, kept in host memory between frames.
//!
//! A sequence is *resident* (its cache is ready for the next frame), *swapped* (its
//! cache is kept aside, outside the worker's KV budget, until it resumes) or unknown
//! (never run here, evicted by recompute, finished or forgotten). The caller describes
//! each sequence of a frame by its whole text so far (prompt and generated tokens) and
//! whether a cache may be reused; the worker then picks the cheapest way in:
//! - a reusable cache (resident, else swapped) of at least all but the text's last
//!   token is cut to exactly that and fed the last token;
//! - otherwise the whole text is prefilled (a fresh sequence, a recompute, or a cache
//!   that is missing, which [`FrameResult::recomputed`] reports).
//!
//! Cutting a longer cache is what makes an aborted frame harmless: the tokens it
//! generated were never reported, so the next frame names a shorter text, and the
//! prefix of a causal model's cache is the cache of the prefix.

use std::collections::HashMap;

use super::cache::SequenceCache;
use super::session::{DecoderSession, FrameRun, FrameSequence, StepTiming};
use crate::error::Result;

/// How a sequence leaves the worker's KV budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Drop its cache; it is prefilled again when it resumes.
    Recompute,
    /// Keep its cache aside until it resumes.
    Swap,
}

/// One sequence of a frame, as the caller knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameRequest {
    /// The sequence.
    pub id: u64,
    /// Its text so far: prompt, then the generated tokens.
    pub text: Vec<i64>,
    /// Whether a cache this worker holds may be reused (false: prefill the text).
    pub reuse: bool,
    /// Tokens to generate.
    pub steps: usize,
    /// Whether the sequence ends with this frame (its cache is dropped after).
    pub last: bool,
}

/// One sequence's result.
#[derive(Debug, Clone, PartialEq)]
pub struct FrameResult {
    /// The sequence.
    pub id: u64,
    /// The tokens it generated.
    pub tokens: Vec<i64>,
    /// Positions prefilled for it (0 when it resumed from a cache).
    pub prefilled: usize,
    /// A cache was to be reused but none was held, so the text was prefilled.
    pub recomputed: bool,
    /// Positions cut from a reused cache that was longer than the text (after a frame
    /// whose tokens the caller dropped, e.g. an aborted one).
    pub trimmed: usize,
    /// A cache was held for a sequence the caller asked to prefill (it was dropped):
    /// the caller's eviction never reached this worker.
    pub stale: bool,
}

/// A frame's results and step timings.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerFrame {
    /// Per sequence, in the request's order.
    pub results: Vec<FrameResult>,
    /// Per model call.
    pub steps: Vec<StepTiming>,
}

/// A session and the caches of its sequences.
#[derive(Debug)]
pub struct DecoderWorker {
    session: DecoderSession,
    resident: HashMap<u64, SequenceCache>,
    swapped: HashMap<u64, SequenceCache>,
}

impl DecoderWorker {
    /// A worker around `session`, holding nothing.
    pub fn new(session: DecoderSession) -> Self {
        Self { session, resident: HashMap::new(), swapped: HashMap::new() }
    }

    /// The session.
    pub fn session(&mut self) -> &mut DecoderSession {
        &mut self.session
    }

    /// Swap the session for another of the same decoder (e.g. with other threads); the
    /// caches stay.
    pub fn replace_session(&mut self, session: DecoderSession) {
        self.session = session;
    }

    /// Run one frame. On an error (an abort included) the caches of the frame's
    /// sequences are gone, and they are prefilled when they run again.
    pub fn run(&mut self, requests: &[FrameRequest], stop: &dyn Fn() -> bool) -> Result<WorkerFrame> {
        let config = *self.session.config();
        let mut sequences = Vec::with_capacity(requests.len());
        let mut results = Vec::with_capacity(requests.len());
        for request in requests {
            let held = self.resident.remove(&request.id).or_else(|| self.swapped.remove(&request.id));
            let wanted = request.text.len().saturating_sub(1);
            let stale = !request.reuse && held.is_some();
            let (cache, feed, recomputed, trimmed) = match held {
                Some(mut cache) if request.reuse && wanted > 0 && cache.len() >= wanted => {
                    let trimmed = cache.len() - wanted;
                    cache.truncate(wanted);
                    (cache, request.text[wanted..].to_vec(), false, trimmed)
                }
                held => (SequenceCache::empty(&config), request.text.clone(), request.reuse && held.is_none(), 0),
            };
            let prefilled = if cache.is_empty() { feed.len() } else { 0 };
            results.push(FrameResult { id: request.id, tokens: Vec::new(), prefilled, recomputed, trimmed, stale });
            sequences.push(FrameSequence { cache, feed, steps: request.steps });
        }
        let FrameRun { outputs, steps } = self.session.run_frame(sequences, stop)?;
        for ((request, result), output) in requests.iter().zip(&mut results).zip(outputs) {
            result.tokens = output.tokens;
            if !request.last {
                self.resident.insert(request.id, output.cache);
            }
        }
        Ok(WorkerFrame { results, steps })
    }

    /// Take a resident sequence out of the KV budget.
    pub fn evict(&mut self, id: u64, how: Eviction) {
        if let Some(cache) = self.resident.remove(&id) {
            if how == Eviction::Swap {
                self.swapped.insert(id, cache);
            }
        }
    }

    /// Drop everything held for a sequence (it ended).
    pub fn forget(&mut self, id: u64) {
        self.resident.remove(&id);
        self.swapped.remove(&id);
    }

    /// Bytes of the resident caches (what counts against the worker's KV budget).
    pub fn resident_bytes(&self) -> u64 {
        self.resident.values().map(SequenceCache::bytes).sum()
    }

    /// Bytes of the swapped caches.
    pub fn swapped_bytes(&self) -> u64 {
        self.swapped.values().map(SequenceCache::bytes).sum()
    }

    /// Resident sequences and their cached positions, by id.
    pub fn resident(&self) -> Vec<(u64, usize)> {
        let mut all: Vec<_> = self.resident.iter().map(|(id, c)| (*id, c.len())).collect();
        all.sort_unstable();
        all
    }

    /// Swapped sequences and their cached positions, by id.
    pub fn swapped(&self) -> Vec<(u64, usize)> {
        let mut all: Vec<_> = self.swapped.iter().map(|(id, c)| (*id, c.len())).collect();
        all.sort_unstable();
        all
    }
}
