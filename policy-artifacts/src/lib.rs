//! Every policy `.wasm` of the workspace, built for `wasm32-wasip2` by this crate's
//! build script whenever the contract, the SDK or a policy changes.
//!
//! `cargo build -p yardmaster-policy-artifacts` is the one command that builds them
//! all; the host embeds [`SHIPPED`] so `yardmaster policy export` can write them out.

/// A policy component built from this workspace.
#[derive(Debug, Clone, Copy)]
pub struct Artifact {
    /// Short name (`edf`).
    pub name: &'static str,
    /// Cargo package it was built from (`policy-edf`).
    pub package: &'static str,
    /// Where the build left the `.wasm` file.
    pub path: &'static str,
    /// The component's bytes.
    pub bytes: &'static [u8],
}

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));

/// A shipped policy by short name.
pub fn shipped(name: &str) -> Option<&'static Artifact> {
    SHIPPED.iter().find(|a| a.name == name)
}
