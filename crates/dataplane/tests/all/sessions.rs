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
