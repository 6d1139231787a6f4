//! What the engine's unit tests share.

use crate::Request;

/// A plain request `id` of `origin` at the first stage: one item, no sequence, deadline 1.
pub(crate) fn request(id: u64, origin: u64) -> Request {
    Request {
        id,
        origin,
        stage: 0,
        stream: 0,
        sent_at: 0,
        arrived_at: 0,
        deadline: 1,
        priority: 0,
        input_size: 0,
        expected_tokens: 0,
        requeues: 0,
        tags: None,
        items: 1,
        correlation: None,
    }
}
