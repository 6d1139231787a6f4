//! A scratch repository directory for this module's tests.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A directory under the system's temporary directory, removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A fresh, empty directory; `tag` names it for a reader of the temp folder.
    pub fn new(tag: &str) -> TempDir {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("yardmaster-model-repository-{}-{tag}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        TempDir(path)
    }

    /// Write `contents` at `relative`, creating folders.
    pub fn file(&self, relative: &str, contents: impl AsRef<[u8]>) -> &Self {
        let path = self.0.join(relative);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, contents).unwrap();
        self
    }

    /// A (fake) model file in each of `versions` of `model`.
    pub fn onnx(&self, model: &str, versions: &[u64]) -> &Self {
        for v in versions {
            self.file(&format!("{model}/{v}/model.onnx"), "not really onnx");
        }
        self
    }

    /// An empty folder at `relative`.
    pub fn folder(&self, relative: &str) -> &Self {
        fs::create_dir_all(self.0.join(relative)).unwrap();
        self
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}
