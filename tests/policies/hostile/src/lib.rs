//! Test fixture: a policy that misbehaves on purpose, to prove the host contains it.
//!
//! Until it misbehaves it holds every request it receives (never dispatches), so a
//! test can check that the host replays exactly those requests into the fallback.
//! Parameters:
//! - `mode`: what to do — `hold` (only hold), `spin` (loop forever), `recurse`
//!   (unbounded recursion), `membomb` (allocate until memory runs out), `trap`
//!   (panic), `trap-init` (fail in init by trapping), `refuse-init` (return an error
//!   from init), `invalid` (emit invalid actions next to one valid drop), `flood`
//!   (return 200 000 actions), `poach` (serve its own requests first come first
//!   served, and try to drop and dispatch the neighbouring ids, which in an A/B run
//!   belong to the other arm);
//! - `after`: how many `handle` calls behave before the misbehaviour (default 0).

use yardmaster_sdk::{Ctx, DropReason, EndReason, Policy, Request, RequestId, WorkerId};

/// The misbehaving policy.
pub struct Hostile {
    mode: String,
    after: u32,
    calls: u32,
    held: Vec<Request>,
    idle: Vec<WorkerId>,
}

impl Policy for Hostile {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let mode = ctx.param("mode").unwrap_or("hold").to_string();
        match mode.as_str() {
            "trap-init" => panic!("hostile policy: trap in init"),
            "refuse-init" => return Err("hostile policy refuses to start".into()),
            _ => {}
        }
        let after = ctx.param_or("after", 0u32)?;
        Ok(Self { mode, after, calls: 0, held: Vec::new(), idle: Vec::new() })
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push(request);
    }

    fn on_worker_idle(&mut self, _ctx: &mut Ctx, worker: WorkerId) {
        self.idle.push(worker);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|r| r.id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.calls += 1;
        if self.calls <= self.after {
            return;
        }
        match self.mode.as_str() {
            "spin" => ctx.set_timer(spin(ctx.now()), 0),
            "recurse" => {
                let depth = recurse(ctx.now());
                ctx.set_timer(depth, 0);
            }
            "membomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(vec![1u8; 1 << 20]);
                    ctx.set_timer(hoard.len() as u64, 0);
                }
            }
            "trap" => panic!("hostile policy: trap in handle"),
            "invalid" => self.emit_invalid(ctx),
            "poach" => self.poach(ctx),
            "flood" => {
                for i in 0..200_000u64 {
                    ctx.set_timer(i, i);
                }
            }
            _ => {}
        }
    }
}

impl Hostile {
    /// Serve what it holds in order on its idle workers, and reach for requests that
    /// are not its own: the ids next to each of its requests.
    fn poach(&mut self, ctx: &mut Ctx) {
        for request in &self.held {
            for other in [request.id.wrapping_sub(1), request.id + 1, request.id + 2] {
                if self.held.iter().all(|r| r.id != other) {
                    ctx.drop_request(other, DropReason::Policy);
                    if let Some(&worker) = self.idle.first() {
                        ctx.dispatch(worker, vec![other]);
                    }
                }
            }
        }
        while !self.held.is_empty() {
            let Some(worker) = self.idle.pop() else { break };
            let request = self.held.remove(0);
            ctx.dispatch(worker, vec![request.id]);
        }
    }

    /// One valid drop surrounded by actions the host must reject.
    fn emit_invalid(&mut self, ctx: &mut Ctx) {
        let Some(first) = self.held.first().map(|r| r.id) else { return };
        let worker = self.idle.first().copied().unwrap_or(0);
        let stage = ctx.worker(worker).map(|w| w.info.stage).unwrap_or(0);
        let over_limit = ctx.batch_limit(stage) + 1;
        // Unknown request.
        ctx.dispatch(worker, vec![u64::MAX]);
        // Unknown worker.
        ctx.dispatch(9_999, vec![first]);
        // Batch over the stage's limit (the same request repeated).
        ctx.dispatch(worker, vec![first; over_limit as usize]);
        // Scale beyond the cluster.
        ctx.scale(stage, 1_000_000, None);
        // Zero threads.
        ctx.set_threads(worker, 0);
        // The valid one.
        ctx.drop_request(first, DropReason::Policy);
        // Dropping the same request again in the same call is invalid too.
        ctx.drop_request(first, DropReason::Policy);
        self.held.remove(0);
    }
}

#[inline(never)]
fn spin(seed: u64) -> u64 {
    let mut x = seed | 1;
    loop {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        if x == 0 {
            return x;
        }
    }
}

#[inline(never)]
fn recurse(n: u64) -> u64 {
    let mut frame = [n; 64];
    // The condition never holds for the values a clock reads; it only keeps the
    // compiler from proving the recursion endless.
    if n == u64::MAX {
        return 0;
    }
    frame[(n % 64) as usize] = recurse(n.wrapping_add(1));
    std::hint::black_box(&frame);
    frame[0]
}

yardmaster_sdk::export_policy!(Hostile);
