//! One sequence's KV cache in host memory, compact (no padding): per layer, keys and
//! values as `[heads, len, head_dim]` float32, so a batch tensor's row is filled with
//! one copy per head.

use super::model::DecoderConfig;

/// The keys and values a sequence has cached, `len` positions long.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceCache {
    len: usize,
    heads: usize,
    head_dim: usize,
    /// Per layer: (keys, values), each `[heads, len, head_dim]`.
    layers: Vec<(Vec<f32>, Vec<f32>)>,
}

impl SequenceCache {
    /// An empty cache (nothing prefilled yet).
    pub fn empty(config: &DecoderConfig) -> Self {
        Self { len: 0, heads: config.heads, head_dim: config.head_dim(), layers: vec![(Vec::new(), Vec::new()); config.layers] }
    }

    /// A cache from its parts; `layers[l]` holds `heads·len·head_dim` keys and values.
    pub(crate) fn from_parts(len: usize, heads: usize, head_dim: usize, layers: Vec<(Vec<f32>, Vec<f32>)>) -> Self {
        debug_assert!(layers.iter().all(|(k, v)| k.len() == heads * len * head_dim && v.len() == k.len()));
        Self { len, heads, head_dim, layers }
    }

    /// Cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Host memory the cached keys and values take.
    pub fn bytes(&self) -> u64 {
        self.layers.iter().map(|(k, v)| ((k.len() + v.len()) * std::mem::size_of::<f32>()) as u64).sum()
    }

    /// Layer `layer`'s keys (`kind` 0) or values (`kind` 1), `[heads, len, head_dim]`.
    pub(crate) fn part(&self, layer: usize, kind: usize) -> &[f32] {
        let (k, v) = &self.layers[layer];
        if kind == 0 {
            k
        } else {
            v
        }
    }

    /// Keep only the first `len` positions (a causal model's cache of a prefix is the
    /// prefix of its cache).
    pub fn truncate(&mut self, len: usize) {
        if len >= self.len {
            return;
        }
        let (old, dh) = (self.len, self.head_dim);
        for (k, v) in &mut self.layers {
            for part in [k, v] {
                let mut kept = Vec::with_capacity(self.heads * len * dh);
                for head in 0..self.heads {
                    kept.extend_from_slice(&part[head * old * dh..(head * old + len) * dh]);
                }
                *part = kept;
            }
        }
        self.len = len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_keeps_each_heads_prefix() {
        // 1 layer, 2 heads, 3 positions, head_dim 1: head 0 = [0, 1, 2], head 1 = [10, 11, 12].
        let keys = vec![0.0, 1.0, 2.0, 10.0, 11.0, 12.0];
        let mut cache = SequenceCache::from_parts(3, 2, 1, vec![(keys.clone(), keys)]);
        assert_eq!(cache.bytes(), 2 * 6 * 4);
        cache.truncate(2);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.part(0, 0), &[0.0, 1.0, 10.0, 11.0]);
        assert_eq!(cache.part(0, 1), &[0.0, 1.0, 10.0, 11.0]);
        cache.truncate(5);
        assert_eq!(cache.len(), 2, "truncating to more is a no-op");
    }
}
