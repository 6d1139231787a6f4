//! The client side of the LLM stack: requests are token ids in, token ids out.
//!
//! [`LlmService::submit`] hands the engine a request whose input size is the prompt's
//! length and whose expected tokens are its `max_tokens`; when the engine gives it an
//! id, its prompt goes into the [`Transcripts`] (where the decoder workers read it and
//! append what they generate). When it ends, exactly once, its text leaves the
//! transcripts, every worker forgets its caches, and the caller gets a [`Completion`].

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex, MutexGuard};

use super::executor::{LlmHandle, WorkerDirectory};
use yardmaster_engine::metrics::Outcome;
use yardmaster_engine::Submission;

/// One request's text: its prompt and the tokens generated so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Transcript {
    /// The prompt's token ids.
    pub prompt: Vec<i64>,
    /// Generated token ids, in order.
    pub generated: Vec<i64>,
}

impl Transcript {
    /// Prompt then generated tokens.
    pub fn text(&self) -> Vec<i64> {
        [&self.prompt[..], &self.generated[..]].concat()
    }
}

/// Every live request's text, by request id.
#[derive(Debug, Clone, Default)]
pub struct Transcripts(Arc<Mutex<HashMap<u64, Transcript>>>);

impl Transcripts {
    /// The table, locked (a poisoned lock still holds whole entries).
    pub fn lock(&self) -> MutexGuard<'_, HashMap<u64, Transcript>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// How a request ended, with what it generated.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The engine's request id.
    pub id: u64,
    /// Completed, dropped (and why) or failed.
    pub outcome: Outcome,
    /// The tokens generated (all of them when completed; those so far otherwise).
    pub tokens: Vec<i64>,
    /// When it ended (engine clock, nanoseconds).
    pub at: u64,
}

/// Submits token-id requests to the LLM engine actor.
#[derive(Clone)]
pub struct LlmService {
    handle: LlmHandle,
    transcripts: Transcripts,
    directory: WorkerDirectory,
    vocab: usize,
    streams: Vec<String>,
}

impl std::fmt::Debug for LlmService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmService").field("streams", &self.streams).field("vocab", &self.vocab).finish()
    }
}

impl LlmService {
    /// A service over the actor at `handle` whose workers read `transcripts` and
    /// register in `directory`, for a decoder of `vocab` tokens and the pipeline's
    /// `streams` (by name).
    pub fn new(handle: LlmHandle, transcripts: Transcripts, directory: WorkerDirectory, vocab: usize, streams: Vec<String>) -> Self {
        Self { handle, transcripts, directory, vocab, streams }
    }

    /// The actor's handle.
    pub fn handle(&self) -> &LlmHandle {
        &self.handle
    }

    /// The stream called `name`.
    pub fn stream(&self, name: &str) -> Option<u32> {
        self.streams.iter().position(|s| s == name).map(|i| i as u32)
    }

    /// Submit `prompt` on `stream` for `max_tokens` tokens (0: the executor's default);
    /// `on_end` runs exactly once, in the engine's turn, when the request ends.
    pub fn submit(
        &self,
        stream: u32,
        prompt: Vec<i64>,
        max_tokens: u32,
        on_end: impl FnOnce(Completion) + Send + 'static,
    ) -> Result<(), String> {
        self.submit_admitted(stream, prompt, max_tokens, |_| {}, on_end)
    }

    /// [`Self::submit`], with `on_admitted` told the engine's id when the request is
    /// admitted (so a caller that goes away can cancel it).
    pub fn submit_admitted(
        &self,
        stream: u32,
        prompt: Vec<i64>,
        max_tokens: u32,
        on_admitted: impl FnOnce(u64) + Send + 'static,
        on_end: impl FnOnce(Completion) + Send + 'static,
    ) -> Result<(), String> {
        if prompt.is_empty() {
            return Err("the prompt has no tokens".into());
        }
        if let Some(bad) = prompt.iter().find(|&&t| t < 0 || t as usize >= self.vocab) {
            return Err(format!("token {bad} is outside the vocabulary (0..{})", self.vocab));
        }
        if stream as usize >= self.streams.len() {
            return Err(format!("stream {stream} does not exist; the pipeline has {:?}", self.streams));
        }
        let submission = Submission { stream, input_size: prompt.len() as u32, expected_tokens: max_tokens, ..Submission::default() };
        let (admit, finish) = (self.transcripts.clone(), self.transcripts.clone());
        let directory = self.directory.clone();
        let admitted = Box::new(move |id| {
            admit.lock().insert(id, Transcript { prompt, generated: Vec::new() });
            on_admitted(id);
        });
        let ended = Box::new(move |ended: yardmaster_engine::Ended| {
            let transcript = finish.lock().remove(&ended.id).unwrap_or_default();
            directory.forget(ended.id);
            on_end(Completion { id: ended.id, outcome: ended.outcome, tokens: transcript.generated, at: ended.at });
        });
        self.handle.submit(submission, admitted, ended).map_err(|e| e.to_string())
    }

    /// [`Self::submit`], with the completion delivered on a channel.
    pub fn generate(&self, stream: u32, prompt: Vec<i64>, max_tokens: u32) -> Result<Receiver<Completion>, String> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.submit(stream, prompt, max_tokens, move |completion| {
            let _ = reply.send(completion);
        })?;
        Ok(answer)
    }
}
