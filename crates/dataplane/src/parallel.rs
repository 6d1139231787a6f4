//! Independent work items run on scoped threads, the calling thread among them: the
//! stacking of a large batch's requests, the folding of a job's outputs per request.

use std::sync::{Mutex, OnceLock};

/// The cores this process may use, read once: `std::thread::available_parallelism`
/// reads cgroup files on every call, too slow for once per batch (at least 1).
pub fn cores() -> usize {
    static CORES: OnceLock<usize> = OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Run `work` on every item of `items` on up to `threads` threads, the calling one
/// included (one thread, or one item, runs them all here). Helpers take items from a
/// shared queue until it is empty, so one that cannot be spawned leaves its items to
/// the others. Items run in no particular order; `name` names the helper threads.
pub fn each<T: Send>(items: Vec<T>, threads: usize, name: &str, work: impl Fn(T) + Sync) {
    if threads <= 1 || items.len() <= 1 {
        items.into_iter().for_each(work);
        return;
    }
    let queue = Mutex::new(items);
    let drain = || loop {
        let Some(item) = queue.lock().unwrap_or_else(|e| e.into_inner()).pop() else { break };
        work(item);
    };
    std::thread::scope(|scope| {
        for helper in 1..threads {
            if let Err(error) = std::thread::Builder::new().name(format!("{name}-{helper}")).spawn_scoped(scope, drain) {
                tracing::debug!("{name}: one helper thread fewer ({error}); the others take its share");
                break;
            }
        }
        drain();
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn every_item_runs_once_on_one_thread_or_several() {
        for threads in [1, 4] {
            let sum = AtomicU64::new(0);
            let seen = Mutex::new(Vec::new());
            each((1..=100u64).collect(), threads, "test", |n| {
                sum.fetch_add(n, Ordering::Relaxed);
                seen.lock().unwrap().push(n);
            });
            assert_eq!(sum.into_inner(), 5050);
            let mut seen = seen.into_inner().unwrap();
            seen.sort_unstable();
            assert_eq!(seen, (1..=100).collect::<Vec<_>>(), "{threads} threads");
        }
    }
}
