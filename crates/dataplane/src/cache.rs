//! The parameter cache: model bytes (after graph optimisation) kept in host memory, so a
//! new replica of a model already loaded once starts from memory instead of reading and
//! optimising the file again. Least recently used entries leave when system memory use
//! crosses a threshold (85 % by default) or the cache outgrows an optional byte budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::device::Device;

/// A model as the engine names it: the model and one of its variants.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelKey {
    /// Model (stage) name.
    pub model: String,
    /// Variant name.
    pub variant: String,
}

impl ModelKey {
    /// A key from names.
    pub fn new(model: impl Into<String>, variant: impl Into<String>) -> Self {
        ModelKey { model: model.into(), variant: variant.into() }
    }
}

impl std::fmt::Display for ModelKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.model, self.variant)
    }
}

/// What the cache is keyed by: optimised graphs differ per device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The model variant.
    pub model: ModelKey,
    /// The device its graph was optimised for.
    pub device: Device,
}

/// A model held in memory.
#[derive(Debug)]
pub struct CachedModel {
    /// The ONNX bytes.
    pub bytes: Arc<[u8]>,
    /// Whether `bytes` is the graph after ONNX Runtime's optimisations (sessions built
    /// from it skip them).
    pub optimized: bool,
}

/// System memory, as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryUsage {
    /// Total bytes.
    pub total: u64,
    /// Bytes available to new allocations.
    pub available: u64,
}

impl MemoryUsage {
    /// Bytes in use.
    pub fn used(&self) -> u64 {
        self.total.saturating_sub(self.available)
    }
}

/// System memory from `/proc/meminfo` (`None` where there is no such file).
pub fn system_memory() -> Option<MemoryUsage> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    Some(MemoryUsage { total: field("MemTotal:")?, available: field("MemAvailable:")? })
}

/// Reads memory use (replaceable in tests).
pub type MemoryProbe = Arc<dyn Fn() -> Option<MemoryUsage> + Send + Sync>;

/// Limits of the cache.
#[derive(Clone)]
pub struct CacheConfig {
    /// Evict while system memory in use is above this fraction of the total.
    pub memory_threshold: f64,
    /// Evict while the cache holds more than this many bytes (`None`: no budget).
    pub budget_bytes: Option<u64>,
    /// Where memory use is read from.
    pub probe: MemoryProbe,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig { memory_threshold: 0.85, budget_bytes: None, probe: Arc::new(system_memory) }
    }
}

impl std::fmt::Debug for CacheConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheConfig").field("memory_threshold", &self.memory_threshold).field("budget_bytes", &self.budget_bytes).finish()
    }
}

struct Entry {
    model: Arc<CachedModel>,
    last_used: u64,
}

#[derive(Default)]
struct Entries {
    map: HashMap<CacheKey, Entry>,
    clock: u64,
    bytes: u64,
}

/// The host-memory model cache (shared by all workers of a process).
pub struct ModelCache {
    config: CacheConfig,
    entries: Mutex<Entries>,
}

impl std::fmt::Debug for ModelCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelCache").field("config", &self.config).field("entries", &self.len()).field("bytes", &self.bytes()).finish()
    }
}

impl Default for ModelCache {
    fn default() -> Self {
        Self::new(CacheConfig::default())
    }
}

impl ModelCache {
    /// An empty cache with these limits.
    pub fn new(config: CacheConfig) -> Self {
        ModelCache { config, entries: Mutex::new(Entries::default()) }
    }

    /// The model under `key`, marking it most recently used.
    pub fn get(&self, key: &CacheKey) -> Option<Arc<CachedModel>> {
        let mut entries = self.entries.lock().unwrap();
        entries.clock += 1;
        let now = entries.clock;
        entries.map.get_mut(key).map(|entry| {
            entry.last_used = now;
            Arc::clone(&entry.model)
        })
    }

    /// Whether `key` is cached (without touching its recency).
    pub fn contains(&self, key: &CacheKey) -> bool {
        self.entries.lock().unwrap().map.contains_key(key)
    }

    /// Cache a model, then evict least recently used entries (the new one last) until
    /// the limits hold. Returns the keys evicted.
    pub fn insert(&self, key: CacheKey, model: CachedModel) -> Vec<CacheKey> {
        let mut entries = self.entries.lock().unwrap();
        entries.clock += 1;
        let now = entries.clock;
        let size = model.bytes.len() as u64;
        if let Some(old) = entries.map.insert(key, Entry { model: Arc::new(model), last_used: now }) {
            entries.bytes -= old.model.bytes.len() as u64;
        }
        entries.bytes += size;
        // Bytes to free: over the budget, or over the memory threshold (the probe is read
        // once; what eviction frees is counted against it).
        let over_budget = self.config.budget_bytes.map_or(0, |budget| entries.bytes.saturating_sub(budget));
        let over_memory = (self.config.probe)().map_or(0, |m| {
            let allowed = (m.total as f64 * self.config.memory_threshold) as u64;
            m.used().saturating_sub(allowed)
        });
        let mut to_free = over_budget.max(over_memory);
        let mut evicted = Vec::new();
        while to_free > 0 && !entries.map.is_empty() {
            let oldest = entries.map.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()).expect("non-empty");
            let entry = entries.map.remove(&oldest).expect("present");
            let freed = entry.model.bytes.len() as u64;
            entries.bytes -= freed;
            to_free = to_free.saturating_sub(freed);
            tracing::info!(model = %oldest.model, device = %oldest.device, bytes = freed, "model cache: evicted");
            evicted.push(oldest);
        }
        evicted
    }

    /// Drop one entry; whether it was there.
    pub fn remove(&self, key: &CacheKey) -> bool {
        let mut entries = self.entries.lock().unwrap();
        match entries.map.remove(key) {
            Some(entry) => {
                entries.bytes -= entry.model.bytes.len() as u64;
                true
            }
            None => false,
        }
    }

    /// Number of cached models.
    pub fn len(&self) -> usize {
        self.entries.lock().unwrap().map.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.entries.lock().unwrap().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> CacheKey {
        CacheKey { model: ModelKey::new(name, "v"), device: Device::Cpu }
    }

    fn model(size: usize) -> CachedModel {
        CachedModel { bytes: vec![0u8; size].into(), optimized: false }
    }

    fn idle_machine() -> MemoryProbe {
        Arc::new(|| Some(MemoryUsage { total: 1000, available: 900 }))
    }

    #[test]
    fn least_recently_used_leaves_first_under_a_budget() {
        let cache = ModelCache::new(CacheConfig { budget_bytes: Some(250), probe: idle_machine(), ..Default::default() });
        assert!(cache.insert(key("a"), model(100)).is_empty());
        assert!(cache.insert(key("b"), model(100)).is_empty());
        assert!(cache.get(&key("a")).is_some()); // a is now more recent than b
        assert_eq!(cache.insert(key("c"), model(100)), vec![key("b")]);
        assert!(cache.contains(&key("a")) && cache.contains(&key("c")));
        assert_eq!(cache.bytes(), 200);
    }

    #[test]
    fn memory_pressure_above_the_threshold_evicts() {
        // 95 % of memory in use, threshold 85 %: 100 bytes must go.
        let probe: MemoryProbe = Arc::new(|| Some(MemoryUsage { total: 1000, available: 50 }));
        let cache = ModelCache::new(CacheConfig { memory_threshold: 0.85, budget_bytes: None, probe });
        cache.insert(key("a"), model(60));
        // Inserting a alone frees a itself (nothing older); so does the next one once
        // the older entry is not enough.
        assert!(cache.is_empty());
        let cache = ModelCache::new(CacheConfig { probe: idle_machine(), ..Default::default() });
        cache.insert(key("a"), model(60));
        cache.insert(key("b"), model(60));
        assert_eq!(cache.len(), 2, "an idle machine evicts nothing");
    }
}
