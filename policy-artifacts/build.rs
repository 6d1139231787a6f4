//! Builds every policy of the workspace for `wasm32-wasip2` and records where the
//! `.wasm` files are, so tests and the host binary never use a stale policy: Cargo
//! re-runs this script whenever the contract, the SDK or any policy source changes.
//!
//! Shipped policies are the crates under `policies/` (crate `policy-NAME` ships as
//! `NAME`); test fixtures are the crates under `tests/policies/`.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "policy";

struct Crate {
    /// Cargo package name (`policy-fifo`).
    package: String,
    /// Short name (`fifo`).
    name: String,
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().expect("workspace root").to_path_buf();
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());

    // All of `wit`: the SDK and tests/policies/forbidden-import read one version
    // directory of it (`wit/0.1.0`), and Cargo scans a watched directory recursively.
    for watched in ["wit", "sdk", "policies", "tests/policies", "Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=YARDMASTER_POLICY_TARGET_DIR");

    let shipped = discover(&root.join("policies"));
    let fixtures = discover(&root.join("tests/policies"));

    let target_dir = env::var_os("YARDMASTER_POLICY_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| default_target_dir(&out_dir));
    build(&root, &target_dir, shipped.iter().chain(&fixtures));

    let built = target_dir.join(TARGET).join(PROFILE);
    let mut code = String::new();
    code.push_str("/// The policies shipped with Yardmaster, embedded in the binary.\n");
    code.push_str("pub const SHIPPED: &[Artifact] = &[\n");
    for krate in &shipped {
        let path = copy_out(&built, &out_dir, krate);
        writeln!(
            code,
            "    Artifact {{ name: {:?}, package: {:?}, path: {:?}, bytes: include_bytes!({:?}) }},",
            krate.name, krate.package, path, path
        )
        .unwrap();
    }
    code.push_str("];\n\n");
    code.push_str("/// Test fixtures (hostile or malformed policies), by path only.\n");
    code.push_str("pub mod fixtures {\n");
    for krate in &fixtures {
        let path = copy_out(&built, &out_dir, krate);
        let constant = krate.name.to_uppercase().replace('-', "_");
        writeln!(code, "    /// `tests/policies/{}` built for {TARGET}.", krate.name).unwrap();
        writeln!(code, "    pub const {constant}: &str = {path:?};").unwrap();
    }
    code.push_str("}\n");
    fs::write(out_dir.join("artifacts.rs"), code).unwrap();
}

/// Crates in the immediate sub-folders of `dir` whose package is named `policy-*`.
fn discover(dir: &Path) -> Vec<Crate> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let manifest = entry.path().join("Cargo.toml");
        let Ok(text) = fs::read_to_string(&manifest) else { continue };
        let package = text
            .lines()
            .find_map(|line| {
                let line = line.trim();
                let value = line.strip_prefix("name")?.trim_start().strip_prefix('=')?;
                Some(value.trim().trim_matches('"').to_string())
            })
            .unwrap_or_else(|| panic!("{}: no package name", manifest.display()));
        if let Some(name) = package.strip_prefix("policy-") {
            found.push(Crate { name: name.to_string(), package: package.clone() });
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// `<target>/policy-wasm`, next to the host's own build output.
fn default_target_dir(out_dir: &Path) -> PathBuf {
    // OUT_DIR is <target>[/<triple>]/<profile>/build/<crate>-<hash>/out.
    let target = out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(|build| build.parent())
        .and_then(|profile| profile.parent())
        .expect("OUT_DIR inside a Cargo target directory");
    target.join("policy-wasm")
}

fn build<'a>(root: &Path, target_dir: &Path, crates: impl Iterator<Item = &'a Crate>) {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.current_dir(root).args(["build", "--target", TARGET, "--profile", PROFILE, "--target-dir"]).arg(target_dir);
    for krate in crates {
        command.args(["-p", &krate.package]);
    }
    // Flags meant for the host build must not leak into the WebAssembly build.
    for var in ["CARGO_ENCODED_RUSTFLAGS", "RUSTFLAGS", "CARGO_TARGET_DIR", "CARGO_BUILD_TARGET"] {
        command.env_remove(var);
    }
    let output = command.output().expect("run cargo to build the policies");
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let hint = if stderr.contains("wasm32-wasip2") && stderr.contains("target may not be installed")
            || stderr.contains("can't find crate for `core`")
            || stderr.contains("can't find crate for `std`")
        {
            "\nhint: the wasm32-wasip2 target is missing: run `rustup target add wasm32-wasip2` (scripts/setup.sh does)"
        } else {
            ""
        };
        panic!("building the policies for {TARGET} failed:\n{stderr}{hint}");
    }
}

/// Copy a built policy into OUT_DIR and return its path there.
fn copy_out(built: &Path, out_dir: &Path, krate: &Crate) -> String {
    let file = format!("{}.wasm", krate.package.replace('-', "_"));
    let from = built.join(&file);
    let to = out_dir.join(format!("{}.wasm", krate.name));
    fs::copy(&from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    to.display().to_string()
}
