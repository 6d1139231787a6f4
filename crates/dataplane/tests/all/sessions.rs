//! A loaded model's sessions per input shape: a batch runs on the session that last ran
//! its shapes, a new shape gets a new session while there is room, and every session
//! computes what one session would.

use yardmaster_dataplane::{assets, ModelCache, ModelSession, Tensor};

use crate::common;

fn crop(seed: u64) -> Vec<Tensor> {
    let data: Vec<f32> = (0..3 * 48 * 192).map(|i| (((i as u64 * 2654435761 + seed * 97) % 1000) as f32 / 500.0) - 1.0).collect();
    vec![Tensor::new(vec![3, 48, 192], data).unwrap()]
}

#[test]
fn each_input_shape_gets_its_own_session_up_to_the_limit_and_results_do_not_change() {
    let runtime = common::runtime();
    let spec = common::model(assets::CLS_MODEL, "cls");
    let cache = ModelCache::default();
    let mut reference = ModelSession::start(&runtime, &cache, &spec, 1).unwrap().session;
    reference.set_shape_sessions(1);
    let mut shaped = ModelSession::start(&runtime, &cache, &spec, 1).unwrap().session;
    shaped.set_shape_sessions(3);
    assert_eq!(shaped.shape_sessions(), 3);

    let requests: Vec<Vec<Tensor>> = (0..4).map(crop).collect();
    let refs: Vec<&[Tensor]> = requests.iter().map(|r| r.as_slice()).collect();
    // Batch sizes 1, 2, 3 take a session each; 2 and 1 again reuse theirs; 4 is a
    // fourth shape over the limit of 3 and reuses the least recently used session.
    let mut counts = Vec::new();
    for n in [1, 2, 3, 2, 1, 4, 3] {
        let expected = reference.run_batch(&refs[..n], None).unwrap();
        let got = shaped.run_batch(&refs[..n], None).unwrap();
        assert_eq!(got.len(), n);
        for (g, e) in got.iter().zip(&expected) {
            for (a, b) in g.iter().zip(e) {
                assert_eq!(a.shape, b.shape);
                let worst = a.data.floats().iter().zip(b.data.floats()).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
                assert!(worst < 1e-4, "batch of {n}: differs by {worst}");
            }
        }
        counts.push(shaped.session_count());
    }
    assert_eq!(counts, vec![1, 2, 3, 3, 3, 3, 3]);
    assert_eq!(reference.session_count(), 1);

    shaped.set_shape_sessions(1);
    assert_eq!(shaped.session_count(), 1);
    shaped.run_batch(&refs[..2], None).unwrap();
    assert_eq!(shaped.session_count(), 1);
}

/// A buffer shared with the tensors that view it, as a server's receive buffer is.
struct Received(Vec<f32>);

impl yardmaster_dataplane::SharedBytes for Received {
    fn bytes(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

#[test]
fn a_batch_of_one_runs_on_the_requests_own_bytes_and_outputs_are_views_of_onnx_runtimes() {
    use std::sync::Arc;
    use yardmaster_dataplane::{ElementType, TensorData};
    let runtime = common::runtime();
    let spec = common::model(assets::CLS_MODEL, "cls");
    let cache = ModelCache::default();
    let mut session = ModelSession::start(&runtime, &cache, &spec, 1).unwrap().session;
    let owned = crop(7);
    // The request's bytes as they came off the wire, 4 bytes in (aligned for f32):
    // its tensor is a view of them, and the run reads them in place.
    let mut wire = vec![0.0f32];
    wire.extend_from_slice(owned[0].data.floats());
    let received: Arc<dyn yardmaster_dataplane::SharedBytes> = Arc::new(Received(wire));
    let range = 4..received.bytes().len();
    let data = TensorData::shared_or_copied(ElementType::F32, Arc::clone(&received), range.clone(), owned[0].len()).unwrap();
    assert!(data.is_view() && data.shares(&received.bytes()[range]), "aligned bytes are viewed, not copied");
    let viewed = vec![Tensor::new(owned[0].shape.clone(), data).unwrap()];
    let expected = session.run_batch(&[owned.as_slice()], None).unwrap();
    let got = session.run_batch(&[viewed.as_slice()], None).unwrap();
    assert_eq!(session.stacked_bytes(), 0, "a batch of one is not stacked");
    assert_eq!(got, expected, "byte for byte what the request's own copy gives");
    assert!(got[0].iter().all(|t| t.data.is_view()), "outputs are views of ONNX Runtime's buffers");
    // Misaligned bytes are copied once, into an aligned buffer of their type.
    let odd = TensorData::shared_or_copied(ElementType::F32, Arc::clone(&received), 1..5, 1).unwrap();
    assert!(!odd.is_view());
    session.run_batch(&[owned.as_slice(), viewed.as_slice()], None).unwrap();
    assert!(session.stacked_bytes() > 0, "a batch of two is stacked");
}
