//! Triton's system shared-memory extension: a client creates a POSIX shared-memory
//! object (`shm_open`, a file under `/dev/shm`), registers a region of it under a
//! name, and then names the region in place of a tensor's data — inputs are read from
//! it, outputs written into it — so large tensors do not cross the socket.
//!
//! A region is mapped once, at registration, and held by reference count: a request
//! that resolved it keeps its mapping alive even if the region is unregistered
//! meanwhile, so nothing reads or writes unmapped memory. Every access is checked
//! against the region's bounds first.
//!
//! The errors follow Triton's wording where its clients match on it (an unknown
//! region: `Unable to find system shared memory region: 'name'`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use memmap2::MmapMut;
use serde_json::{json, Value};

/// Where POSIX shared-memory objects live.
const SHM_DIR: &str = "/dev/shm";

/// A registered region.
#[derive(Clone)]
struct Region {
    key: String,
    offset: u64,
    byte_size: u64,
    /// The whole object, mapped; the region is `[offset, offset + byte_size)` of it.
    map: Arc<Mutex<MmapMut>>,
}

/// The registered system shared-memory regions, by name.
#[derive(Clone, Default)]
pub struct SharedMemoryRegistry {
    regions: Arc<Mutex<BTreeMap<String, Region>>>,
}

impl std::fmt::Debug for SharedMemoryRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemoryRegistry").field("regions", &self.lock().keys().cloned().collect::<Vec<_>>()).finish()
    }
}

/// Why a shared-memory call or access was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedMemoryError(pub String);

impl std::fmt::Display for SharedMemoryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn fail<T>(message: String) -> Result<T, SharedMemoryError> {
    Err(SharedMemoryError(message))
}

impl SharedMemoryRegistry {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Region>> {
        self.regions.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Register `[offset, offset + byte_size)` of the shared-memory object `key` (as
    /// `shm_open` names it, e.g. `/input_data`) as region `name`.
    pub fn register(&self, name: &str, key: &str, offset: u64, byte_size: u64) -> Result<(), SharedMemoryError> {
        if name.is_empty() {
            return fail("a shared memory region needs a name".into());
        }
        if self.lock().contains_key(name) {
            return fail(format!("shared memory region '{name}' already in manager"));
        }
        let file_name = key.trim_start_matches('/');
        if file_name.is_empty() || file_name.contains('/') || file_name == "." || file_name == ".." {
            return fail(format!("Unable to open shared memory region: '{key}' is not a shared memory key (shm_open's /name)"));
        }
        let path = PathBuf::from(SHM_DIR).join(file_name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| SharedMemoryError(format!("Unable to open shared memory region: '{key}': {e}")))?;
        let size = file.metadata().map_err(|e| SharedMemoryError(format!("shared memory region '{key}': {e}")))?.len();
        let end = offset.checked_add(byte_size).filter(|end| *end <= size);
        if end.is_none() {
            return fail(format!(
                "shared memory region '{name}': offset {offset} + byte_size {byte_size} is past the end of '{key}' ({size} bytes)"
            ));
        }
        // SAFETY: the object is shared with the client by design; the mapping is only
        // read and written through bounds-checked copies while the lock is held.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| SharedMemoryError(format!("mapping '{key}': {e}")))?;
        let region = Region { key: key.to_string(), offset, byte_size, map: Arc::new(Mutex::new(map)) };
        self.lock().insert(name.to_string(), region);
        Ok(())
    }

    /// Unregister region `name` (requests already using it finish with it).
    pub fn unregister(&self, name: &str) -> Result<(), SharedMemoryError> {
        match self.lock().remove(name) {
            Some(_) => Ok(()),
            None => fail(format!("Unable to find system shared memory region: '{name}'")),
        }
    }

    /// Unregister every region.
    pub fn unregister_all(&self) {
        self.lock().clear();
    }

    /// The status of region `name`, or of every region: `[{name, key, offset, byte_size}]`.
    pub fn status(&self, name: Option<&str>) -> Result<Value, SharedMemoryError> {
        let regions = self.lock();
        let view = |(name, r): (&String, &Region)| json!({"name": name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size});
        match name {
            Some(name) => match regions.get_key_value(name) {
                Some(entry) => Ok(Value::Array(vec![view(entry)])),
                None => fail(format!("Unable to find system shared memory region: '{name}'")),
            },
            None => Ok(Value::Array(regions.iter().map(view).collect())),
        }
    }

    /// Every region as `(name, key, offset, byte_size)`.
    pub fn regions(&self) -> Vec<(String, String, u64, u64)> {
        self.lock().iter().map(|(name, r)| (name.clone(), r.key.clone(), r.offset, r.byte_size)).collect()
    }

    fn resolve(&self, name: &str, offset: u64, size: u64) -> Result<(Arc<Mutex<MmapMut>>, usize, usize), SharedMemoryError> {
        let region = self
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| SharedMemoryError(format!("Unable to find system shared memory region: '{name}'")))?;
        let inside = offset.checked_add(size).is_some_and(|end| end <= region.byte_size);
        if !inside {
            return fail(format!(
                "{size} bytes at offset {offset} do not fit in shared memory region '{name}' of {} bytes",
                region.byte_size
            ));
        }
        let start = (region.offset + offset) as usize;
        Ok((region.map, start, start + size as usize))
    }

    /// Copy `size` bytes at `offset` of region `name` out.
    pub fn read(&self, name: &str, offset: u64, size: u64) -> Result<Vec<u8>, SharedMemoryError> {
        let (map, start, end) = self.resolve(name, offset, size)?;
        let map = map.lock().unwrap_or_else(|p| p.into_inner());
        Ok(map[start..end].to_vec())
    }

    /// Copy `bytes` into region `name` at `offset`, within `room` bytes the request
    /// gave for them.
    pub fn write(&self, name: &str, offset: u64, room: u64, bytes: &[u8]) -> Result<(), SharedMemoryError> {
        if bytes.len() as u64 > room {
            return fail(format!("the output needs {} bytes but shared_memory_byte_size gives {room} in region '{name}'", bytes.len()));
        }
        let (map, start, end) = self.resolve(name, offset, bytes.len() as u64)?;
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        map[start..end].copy_from_slice(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Object(PathBuf);

    impl Object {
        fn new(name: &str, bytes: &[u8]) -> Object {
            let path = PathBuf::from(SHM_DIR).join(format!("{name}-{}", std::process::id()));
            std::fs::write(&path, bytes).unwrap();
            Object(path)
        }
        fn key(&self) -> String {
            format!("/{}", self.0.file_name().unwrap().to_str().unwrap())
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn a_region_is_read_and_written_within_its_bounds_only() {
        let object = Object::new("ym-shm-test", &(0u8..64).collect::<Vec<_>>());
        let registry = SharedMemoryRegistry::default();
        registry.register("in", &object.key(), 16, 32).unwrap();
        assert_eq!(registry.read("in", 4, 4).unwrap(), vec![20, 21, 22, 23]);
        registry.write("in", 0, 8, &[9, 9]).unwrap();
        assert_eq!(std::fs::read(&object.0).unwrap()[16..19], [9, 9, 18], "written through to the object");
        let past = registry.read("in", 30, 4).unwrap_err().0;
        assert!(past.contains("do not fit") && past.contains("32 bytes"), "{past}");
        assert!(registry.write("in", 0, 1, &[1, 2]).unwrap_err().0.contains("needs 2 bytes"));
        assert_eq!(registry.status(None).unwrap()[0]["offset"], 16);
        assert!(registry.register("in", &object.key(), 0, 8).unwrap_err().0.contains("already in manager"));
        registry.unregister("in").unwrap();
        let gone = registry.read("in", 0, 1).unwrap_err().0;
        assert_eq!(gone, "Unable to find system shared memory region: 'in'");
        assert!(registry.unregister("in").is_err());
    }

    #[test]
    fn bad_registrations_are_refused_with_the_reason() {
        let object = Object::new("ym-shm-small", &[0; 8]);
        let registry = SharedMemoryRegistry::default();
        let too_big = registry.register("r", &object.key(), 4, 8).unwrap_err().0;
        assert!(too_big.contains("past the end") && too_big.contains("8 bytes"), "{too_big}");
        let missing = registry.register("r", "/ym-no-such-object", 0, 1).unwrap_err().0;
        assert!(missing.starts_with("Unable to open shared memory region: '/ym-no-such-object'"), "{missing}");
        assert!(registry.register("r", "/../etc/passwd", 0, 1).unwrap_err().0.contains("not a shared memory key"));
        assert!(registry.register("r", &object.key(), u64::MAX, 2).is_err(), "an overflowing range");
        assert_eq!(registry.status(None).unwrap(), json!([]));
    }
}
