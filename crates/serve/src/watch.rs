//! The watched directory: a policy `.wasm` that appears in it (or changes) is swapped
//! in, when its SHA-256 is on the configured allow-list or when there is no list.
//!
//! The directory is polled every second. A file is acted on once its size and
//! modification time have stayed the same over two polls, so a file still being
//! copied in is not read half-written (writing it elsewhere and renaming it in is
//! better still); files whose names start with `.` are ignored. Files already there
//! when the server starts are not swapped in. Every outcome — swapped, refused by the
//! loader, not on the allow-list — is one log line.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};

use super::swap::{PolicyControl, PolicySource};

/// How often the directory is read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// A file's identity between polls: size and modification time.
type Fingerprint = (u64, Option<SystemTime>);

/// The running watcher thread.
pub struct Watcher {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl Watcher {
    /// Watch `dir` (which must exist), swapping in through `swapper`; `allow` is the
    /// allow-list of SHA-256s in hex (empty: any file).
    pub fn start(dir: PathBuf, allow: Vec<String>, swapper: Arc<dyn PolicyControl>) -> Result<Watcher> {
        let mut scan =
            Scan { dir, allow: allow.iter().map(|s| s.to_ascii_lowercase()).collect(), handled: HashMap::new(), seen: HashMap::new() };
        let present = scan.list().with_context(|| format!("reading the watched directory {}", scan.dir.display()))?;
        scan.handled.extend(present);
        tracing::info!(dir = %scan.dir.display(), present = scan.handled.len(), allow_list = scan.allow.len(), "watching for policy files to swap in");
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new().name("yardmaster-watch".into()).spawn(move || loop {
            match stopped.recv_timeout(POLL_INTERVAL) {
                Err(RecvTimeoutError::Timeout) => scan.poll(&*swapper),
                Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
            }
        })?;
        Ok(Watcher { stop, thread: Some(thread) })
    }

    /// Stop watching and wait for the thread (a swap under way finishes first).
    pub fn stop(mut self) {
        let _ = self.stop.send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}

struct Scan {
    dir: PathBuf,
    allow: Vec<String>,
    /// Files acted on (or present at start), with the fingerprint they had.
    handled: HashMap<PathBuf, Fingerprint>,
    /// Fingerprints seen at the last poll, for files not yet acted on.
    seen: HashMap<PathBuf, Fingerprint>,
}

impl Scan {
    fn list(&self) -> std::io::Result<Vec<(PathBuf, Fingerprint)>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            let hidden = path.file_name().and_then(|n| n.to_str()).is_none_or(|n| n.starts_with('.'));
            if hidden || path.extension().is_none_or(|e| e != "wasm") {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_file() {
                files.push((path, (meta.len(), meta.modified().ok())));
            }
        }
        files.sort();
        Ok(files)
    }

    fn poll(&mut self, swapper: &dyn PolicyControl) {
        let files = match self.list() {
            Ok(files) => files,
            Err(error) => {
                tracing::warn!(dir = %self.dir.display(), %error, "cannot read the watched directory");
                return;
            }
        };
        let mut seen = HashMap::new();
        for (path, fingerprint) in files {
            if self.handled.get(&path) == Some(&fingerprint) {
                continue;
            }
            if self.seen.get(&path) == Some(&fingerprint) {
                self.handled.insert(path.clone(), fingerprint);
                self.act(&path, swapper);
            } else {
                seen.insert(path, fingerprint);
            }
        }
        self.seen = seen;
    }

    fn act(&self, path: &Path, swapper: &dyn PolicyControl) {
        let file = path.display();
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) => return tracing::warn!(%file, %error, "watched directory: cannot read the file"),
        };
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if !self.allow.is_empty() && !self.allow.contains(&sha256) {
            return tracing::warn!(%file, %sha256, "watched directory: not swapped in, its SHA-256 is not on the allow-list (watch_sha256)");
        }
        let name = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        match swapper.swap(&PolicySource::Bytes { name, bytes }) {
            Ok(summary) if summary.fault.is_none() => {
                tracing::info!(%file, %sha256, pause_us = summary.pause_us, replayed = summary.replayed, "watched directory: policy swapped in")
            }
            Ok(summary) => {
                tracing::warn!(%file, %sha256, state = summary.state, fault = ?summary.fault, "watched directory: swapped in, but the policy faulted at once")
            }
            Err(error) => tracing::warn!(%file, %sha256, %error, "watched directory: not swapped in"),
        }
    }
}
