//! Where a shipped policy breaks by its own documentation: the sweep labels a cliff or
//! a low-load miss found there as documented rather than as a regression.
//!
//! A baseline may break where its paper says it does — FIFO never drops, so past
//! capacity its queue outgrows the SLO; a scheduler that plans without the downstream
//! view falls off past capacity. Each entry names the policy, the kind of break, one
//! sentence of why, and the section of the policy's doc that gives the evidence. The
//! reference policies have no entry: anything the sweep flags for them is a finding.
//!
//! `sim sweep --strict` fails on undocumented flags only, so a baseline breaking where
//! its paper predicts does not fail CI, and the same baseline breaking somewhere new
//! does.

/// The two things the sweep flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakKind {
    /// At or past the capacity, goodput under the cliff fraction of the best at a
    /// lower load.
    PastCapacity,
    /// Under the low-load on-time share at half the capacity or less, or a cliff below
    /// the capacity (the same cause shows as both).
    LowLoad,
}

/// One documented break.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocumentedBreak {
    /// The shipped policy's name.
    pub policy: &'static str,
    /// Which flag it explains.
    pub kind: BreakKind,
    /// Why, in one sentence.
    pub why: &'static str,
    /// Where the evidence is: `FILE, SECTION` — a doc file and (part of) one of its headings.
    pub doc: &'static str,
}

impl DocumentedBreak {
    /// The label a sweep row carries: why, and where to read more.
    pub fn label(&self) -> String {
        format!("{} ({})", self.why, self.doc)
    }
}

/// Every documented break of the shipped policies.
pub const DOCUMENTED_BREAKS: &[DocumentedBreak] = &[
    DocumentedBreak {
        policy: "fifo",
        kind: BreakKind::PastCapacity,
        why: "never drops and never scales: past capacity its queue outgrows the SLO",
        doc: "docs/sweep.md, fifo and edf: where they break",
    },
    DocumentedBreak {
        policy: "fifo",
        kind: BreakKind::LowLoad,
        why: "batches as much as the stage allows whatever the SLO: a burst's batch ends late and the next is longer",
        doc: "docs/sweep.md, fifo and edf: where they break",
    },
    DocumentedBreak {
        policy: "edf",
        kind: BreakKind::PastCapacity,
        why: "never scales, and judges a deadline on its own stage only: what it admits dies downstream",
        doc: "docs/sweep.md, fifo and edf: where they break",
    },
    DocumentedBreak {
        policy: "edf",
        kind: BreakKind::LowLoad,
        why: "judges a deadline on its own stage only: the first stage's batch spends the later stages' budget",
        doc: "docs/sweep.md, fifo and edf: where they break",
    },
    DocumentedBreak {
        policy: "flex-clockwork",
        kind: BreakKind::PastCapacity,
        why: "least slack first serves many small batches of the most urgent requests, which then fail anyway, as SHEPHERD's evaluation reports",
        doc: "docs/flex.md, The baselines on the random applications",
    },
    DocumentedBreak {
        policy: "flex-nexus",
        kind: BreakKind::PastCapacity,
        why: "plans for an arrival rate it can fully serve with fixed workers and cannot re-plan within an epoch, as SHEPHERD's evaluation reports",
        doc: "docs/flex.md, The baselines on the random applications",
    },
    DocumentedBreak {
        policy: "loki-inferline",
        kind: BreakKind::PastCapacity,
        why: "no accuracy scaling: past its most accurate variants' capacity its goodput falls, as Loki's evaluation reports",
        doc: "docs/loki.md, InferLine-like: past its most accurate variants' capacity",
    },
    DocumentedBreak {
        policy: "loki-inferline",
        kind: BreakKind::LowLoad,
        why: "hosts only each task's most accurate variant, whose capacity on the whole cluster is under 1.5x the demand where it misses",
        doc: "docs/loki.md, InferLine-like: past its most accurate variants' capacity",
    },
    DocumentedBreak {
        policy: "loki-proteus",
        kind: BreakKind::PastCapacity,
        why: "per-task accuracy scaling misses the dependencies between tasks and makes bottlenecks, as Loki's evaluation reports",
        doc: "docs/loki.md, Proteus-like: an equal SLO split and per-task planning",
    },
    DocumentedBreak {
        policy: "loki-proteus",
        kind: BreakKind::LowLoad,
        why: "an equal SLO split leaves slow tasks no feasible plan, and per-task plans starve one task of workers",
        doc: "docs/loki.md, Proteus-like: an equal SLO split and per-task planning",
    },
    DocumentedBreak {
        policy: "pard-naive",
        kind: BreakKind::PastCapacity,
        why: "serves first come first served and never drops: past capacity it cannot clear accumulated requests, as PARD's evaluation reports",
        doc: "docs/pard.md, The baselines on the random set, and where the paper says they break",
    },
    DocumentedBreak {
        policy: "pard-nexus",
        kind: BreakKind::PastCapacity,
        why: "its window test sees only the current module and drops in arrival order: requests die downstream after earlier modules spent time on them",
        doc: "docs/pard.md, The baselines on the random set, and where the paper says they break",
    },
    DocumentedBreak {
        policy: "pard-clipper",
        kind: BreakKind::PastCapacity,
        why: "each module drops what used its fixed share of the SLO after earlier modules spent time on it: later-module drops, as PARD's evaluation reports",
        doc: "docs/pard.md, The baselines on the random set, and where the paper says they break",
    },
    DocumentedBreak {
        policy: "quart-fixed",
        kind: BreakKind::PastCapacity,
        why: "never scales and never drops: past its replicas' capacity its FIFO queues grow until every request is late (QUART §3.2)",
        doc: "docs/quart.md, Where QUART's baselines break, as their paper says",
    },
    DocumentedBreak {
        policy: "quart-reactive",
        kind: BreakKind::PastCapacity,
        why: "never drops and adds replicas only from free GPUs (none once the cluster is started): its queues outgrow the SLO (QUART §3.2)",
        doc: "docs/quart.md, Where QUART's baselines break, as their paper says",
    },
    DocumentedBreak {
        policy: "quart-uniform",
        kind: BreakKind::PastCapacity,
        why: "never drops and scales every stage alike from the entry's rate: past capacity its queues outgrow the SLO (QUART §3.2)",
        doc: "docs/quart.md, Where QUART's baselines break, as their paper says",
    },
    DocumentedBreak {
        policy: "quart-uniform",
        kind: BreakKind::LowLoad,
        why: "one replica count for every stage from the entry's rate starves stages below a fan-out or with a slow model (QUART §3.3)",
        doc: "docs/quart.md, Where QUART's baselines break, as their paper says",
    },
];

/// The documented break of `policy` of this kind, if any. `policy` may be a shipped
/// name (`quart-fixed`) or the stem of a built policy file (`policy_quart_fixed`).
pub fn documented_break(policy: &str, kind: BreakKind) -> Option<&'static DocumentedBreak> {
    let name = policy.strip_prefix("policy_").map(|stem| stem.replace('_', "-"));
    let name = name.as_deref().unwrap_or(policy);
    DOCUMENTED_BREAKS.iter().find(|b| b.policy == name && b.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shipped_name_and_a_built_file_s_stem_find_the_same_break() {
        let by_name = documented_break("fifo", BreakKind::PastCapacity).expect("fifo's cliff is documented");
        assert_eq!(documented_break("policy_fifo", BreakKind::PastCapacity), Some(by_name));
        assert!(documented_break("no-such-policy", BreakKind::LowLoad).is_none());
        assert!(documented_break("pard", BreakKind::PastCapacity).is_none(), "a reference policy's flags are findings");
    }

    #[test]
    fn every_entry_is_unique_says_why_and_names_a_doc_section_that_exists() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        for (i, b) in DOCUMENTED_BREAKS.iter().enumerate() {
            assert!(!b.why.is_empty() && b.why.len() < 200, "{b:?}");
            let (file, section) = b.doc.split_once(", ").expect("\"FILE, SECTION\"");
            let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{}: {file}: {e}", b.policy));
            assert!(
                text.lines().any(|line| line.starts_with('#') && line.contains(section)),
                "{}: {file} has no heading \"{section}\"",
                b.policy
            );
            assert!(!DOCUMENTED_BREAKS[..i].iter().any(|o| o.policy == b.policy && o.kind == b.kind), "{b:?} twice");
        }
    }
}
