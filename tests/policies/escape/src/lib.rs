//! Test fixture: a policy that tries to leave the sandbox through the WASI interfaces
//! Rust's standard library links in. The host binds those imports to stubs that trap
//! when called (no preopened directory, no environment, no clock, no stdout), so each
//! attempt must end as a trap of the call, and the arm must fall back.
//!
//! Until it tries, it holds every request it receives (never dispatches), so a test can
//! check that the host replays exactly those requests into the fallback. Parameters:
//! - `probe`: what to try — `read-file` (read `/etc/hostname`), `write-file` (create
//!   `escape.txt`), `list-dir` (list `/`), `env` (read the environment), `clock` (the
//!   wall clock), `stdout` (print a line), `none` (only hold);
//! - `after`: how many `handle` calls behave before the attempt (default 0).
//!
//! Whatever an attempt returns instead of trapping is turned into a timer whose token
//! says what leaked (`1`: it succeeded, `2`: it failed with an error), so a test can
//! tell a contained attempt from one that merely failed politely.

use yardmaster_sdk::{Ctx, EndReason, Policy, Request, RequestId};

/// Timer token: the attempt returned a value.
pub const LEAKED: u64 = 1;
/// Timer token: the attempt returned an error (the import answered instead of trapping).
pub const ANSWERED: u64 = 2;

/// The escaping policy.
pub struct Escape {
    probe: String,
    after: u32,
    calls: u32,
    held: Vec<Request>,
}

impl Policy for Escape {
    fn init(ctx: &mut Ctx) -> Result<Self, String> {
        let probe = ctx.param("probe").unwrap_or("none").to_string();
        let after = ctx.param_or("after", 0u32)?;
        Ok(Self { probe, after, calls: 0, held: Vec::new() })
    }

    fn on_arrival(&mut self, _ctx: &mut Ctx, request: Request) {
        self.held.push(request);
    }

    fn on_request_ended(&mut self, _ctx: &mut Ctx, request: RequestId, _reason: EndReason) {
        self.held.retain(|r| r.id != request);
    }

    fn on_events_done(&mut self, ctx: &mut Ctx) {
        self.calls += 1;
        if self.calls <= self.after {
            return;
        }
        let outcome: Option<bool> = match self.probe.as_str() {
            "read-file" => Some(std::fs::read("/etc/hostname").is_ok()),
            "write-file" => Some(std::fs::write("escape.txt", b"out").is_ok()),
            "list-dir" => Some(std::fs::read_dir("/").is_ok()),
            "env" => Some(std::env::vars().count() > 0),
            "clock" => Some(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).is_ok()),
            "stdout" => {
                println!("escaped");
                Some(true)
            }
            _ => None,
        };
        if let Some(succeeded) = outcome {
            ctx.set_timer(ctx.now(), if succeeded { LEAKED } else { ANSWERED });
        }
    }
}

yardmaster_sdk::export_policy!(Escape);
