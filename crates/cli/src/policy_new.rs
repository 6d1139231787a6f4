//! `yardmaster policy new`: a policy project that builds on its own, outside this
//! repository — the contract's WIT, a starter policy (earliest deadline first), a build
//! script, a test script and a README; for Rust also the SDK's sources.
//!
//! Everything written comes from the binary: the templates under `crates/cli/scaffold/`
//! and, through `build.rs`, the repository's `wit/`, `sdk/` and the Zig example's ABI
//! layer, as they were when the binary was built.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use yardmaster::policy::contract::{ACCEPTED, CONTRACT_VERSION};

/// What `build.rs` embeds.
mod embedded {
    include!(concat!(env!("OUT_DIR"), "/scaffold_sources.rs"));
}

/// The contract version `abi.zig` describes (the Zig project targets it; the host
/// accepts it).
const ZIG_CONTRACT: &str = "0.1.0";

/// The contract the Python and JavaScript starters are written for: they count every
/// request as one item and know no stateful sequences, so they stay on the newest
/// contract without either (0.3.0 added them), where the host never gives them a client
/// batch or a sequence step. The Rust starter is on the SDK, which keeps both rules for
/// it, and takes the latest contract.
const STARTER_CONTRACT: &str = "0.2.0";

/// The arguments of `yardmaster policy new`.
#[derive(clap::Args, Debug)]
pub struct NewArgs {
    /// The policy's language: rust (with the SDK), python (componentize-py), js
    /// (componentize-js) or zig (the canonical ABI by hand, wrapped with wasm-tools).
    #[arg(long, value_enum)]
    pub lang: Lang,
    /// The project's directory: created; an existing one must be empty.
    pub dir: PathBuf,
    /// The policy's name (the Rust package's): default, DIR's last component, made a
    /// valid package name.
    #[arg(long)]
    pub name: Option<String>,
}

/// A language `policy new` writes projects in.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    /// Rust, with the Yardmaster SDK (vendored into the project).
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
    /// Zig, the canonical ABI by hand, wrapped with wasm-tools.
    Zig,
}

impl Lang {
    fn key(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::Zig => "zig",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Lang::Rust => "Rust",
            Lang::Python => "Python",
            Lang::Js => "JavaScript",
            Lang::Zig => "Zig",
        }
    }

    /// The contract version the project is built against.
    fn contract(self) -> &'static str {
        match self {
            Lang::Zig => ZIG_CONTRACT,
            Lang::Python | Lang::Js => STARTER_CONTRACT,
            Lang::Rust => CONTRACT_VERSION,
        }
    }

    /// The decision deadline the README and `test.sh` give the policy, in ms (the
    /// interpreted languages need more than the default 5 ms; docs/languages.md).
    fn deadline_ms(self) -> Option<u32> {
        match self {
            Lang::Python | Lang::Js => Some(100),
            Lang::Rust | Lang::Zig => None,
        }
    }

    /// The templates of the language's own files: (path in the project, template).
    fn templates(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Lang::Rust => &[
                ("Cargo.toml", include_str!("../scaffold/rust/Cargo.toml")),
                ("src/lib.rs", include_str!("../scaffold/rust/src/lib.rs")),
                ("build.sh", include_str!("../scaffold/rust/build.sh")),
                ("test.sh", include_str!("../scaffold/rust/test.sh")),
                (".gitignore", include_str!("../scaffold/rust/gitignore")),
                ("rustfmt.toml", include_str!("../scaffold/rust/rustfmt.toml")),
            ],
            Lang::Python => &[
                ("app.py", include_str!("../scaffold/python/app.py")),
                ("build.sh", include_str!("../scaffold/python/build.sh")),
                ("test.sh", include_str!("../scaffold/python/test.sh")),
                (".gitignore", include_str!("../scaffold/python/gitignore")),
            ],
            Lang::Js => &[
                ("policy.js", include_str!("../scaffold/js/policy.js")),
                ("build.sh", include_str!("../scaffold/js/build.sh")),
                ("test.sh", include_str!("../scaffold/js/test.sh")),
                (".gitignore", include_str!("../scaffold/js/gitignore")),
            ],
            Lang::Zig => &[
                ("policy.zig", include_str!("../scaffold/zig/policy.zig")),
                ("build.sh", include_str!("../scaffold/zig/build.sh")),
                ("test.sh", include_str!("../scaffold/zig/test.sh")),
                (".gitignore", include_str!("../scaffold/zig/gitignore")),
            ],
        }
    }

    /// The language's sections of the README (`<!-- NAME -->` markers).
    fn readme_parts(self) -> &'static str {
        match self {
            Lang::Rust => include_str!("../scaffold/rust/readme-parts.md"),
            Lang::Python => include_str!("../scaffold/python/readme-parts.md"),
            Lang::Js => include_str!("../scaffold/js/readme-parts.md"),
            Lang::Zig => include_str!("../scaffold/zig/readme-parts.md"),
        }
    }
}

/// One file of a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectFile {
    /// Path relative to the project's directory, `/`-separated.
    pub path: String,
    pub contents: String,
}

/// Run `yardmaster policy new`.
pub fn run(args: &NewArgs) -> ExitCode {
    match write_project(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn write_project(args: &NewArgs) -> Result<(), String> {
    let dir = &args.dir;
    check_target(dir)?;
    let raw_name = match &args.name {
        Some(name) => name.clone(),
        None => dir
            .canonicalize()
            .ok()
            .or_else(|| std::path::absolute(dir).ok())
            .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default(),
    };
    let name = package_name(&raw_name);
    let files = project(args.lang, &name)?;
    for file in &files {
        let path = dir.join(&file.path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        std::fs::write(&path, &file.contents).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        if file.path.ends_with(".sh") {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| format!("cannot make {} executable: {e}", path.display()))?;
        }
    }
    let lang = args.lang;
    println!(
        "created {} policy `{name}` in {} ({} files; contract yardmaster:policy@{})",
        lang.title(),
        dir.display(),
        files.len(),
        lang.contract()
    );
    println!("next:");
    println!("  cd {}", dir.display());
    println!("  bash build.sh     # → policy.wasm");
    println!("  bash test.sh      # build, then yardmaster policy check policy.wasm");
    println!("  (README.md: toolchain, checking, simulating and serving it)");
    Ok(())
}

/// Refuse a path that is not a directory, or a directory with anything in it.
fn check_target(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot use {}: {e}", dir.display())),
        Ok(meta) if !meta.is_dir() => Err(format!("{} exists and is not a directory", dir.display())),
        Ok(_) => {
            let mut entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
            if entries.next().is_some() {
                Err(format!(
                    "{} already exists and is not empty: `policy new` writes a new project and never overwrites files; give a new (or empty) directory",
                    dir.display()
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// A valid package name from anything: lowercase ASCII letters, digits and single
/// dashes, starting with a letter (`policy` when nothing is left).
pub fn package_name(raw: &str) -> String {
    let mut name = String::new();
    for c in raw.chars() {
        if c.is_ascii_alphanumeric() {
            name.push(c.to_ascii_lowercase());
        } else if !name.is_empty() && !name.ends_with('-') {
            name.push('-');
        }
    }
    let name = name.trim_end_matches('-').to_string();
    let reserved = ["test", "core", "std", "alloc", "proc-macro", "yardmaster-sdk"];
    if name.is_empty() {
        "policy".into()
    } else if !name.starts_with(|c: char| c.is_ascii_lowercase()) || reserved.contains(&name.as_str()) {
        format!("policy-{name}")
    } else {
        name
    }
}

/// Every file of a project in `lang` named `name` (a valid package name).
pub fn project(lang: Lang, name: &str) -> Result<Vec<ProjectFile>, String> {
    let contract = lang.contract();
    let vars = variables(lang, name)?;
    let mut files = Vec::new();
    for (path, template) in lang.templates() {
        files.push(ProjectFile { path: path.to_string(), contents: fill(template, &vars, path)? });
    }
    files.push(ProjectFile { path: "README.md".into(), contents: fill(&readme(lang)?, &vars, "README.md")? });
    let wit = format!("{contract}/policy.wit");
    let (_, text) = embedded::WIT
        .iter()
        .find(|(path, _)| *path == wit)
        .ok_or_else(|| format!("this binary carries no wit/{wit} (a build problem of yardmaster)"))?;
    files.push(ProjectFile { path: format!("wit/{wit}"), contents: text.to_string() });
    match lang {
        Lang::Rust => {
            files.push(ProjectFile { path: "sdk/Cargo.toml".into(), contents: sdk_manifest()? });
            for (path, text) in embedded::SDK_SOURCES {
                files.push(ProjectFile { path: format!("sdk/src/{path}"), contents: text.to_string() });
            }
        }
        Lang::Zig => files.push(ProjectFile { path: "abi.zig".into(), contents: zig_abi()? }),
        Lang::Python | Lang::Js => {}
    }
    Ok(files)
}

/// The values of the templates' `{{…}}` placeholders.
fn variables(lang: Lang, name: &str) -> Result<BTreeMap<&'static str, String>, String> {
    let mut vars = BTreeMap::new();
    vars.insert("name", name.to_string());
    vars.insert("crate", name.replace('-', "_"));
    vars.insert("lang", lang.key().to_string());
    vars.insert("language", lang.title().to_string());
    vars.insert("contract", lang.contract().to_string());
    vars.insert("latest", CONTRACT_VERSION.to_string());
    vars.insert("accepted", ACCEPTED.to_string());
    vars.insert("yardmaster_version", env!("CARGO_PKG_VERSION").to_string());
    vars.insert("deadline_flag", lang.deadline_ms().map(|ms| format!(" --deadline-ms {ms}")).unwrap_or_default());
    vars.insert("deadline_ms", lang.deadline_ms().unwrap_or(5).to_string());
    let rust_version = workspace_table("workspace.package").get("rust-version").map(|v| v.trim_matches('"').to_string());
    vars.insert("rust_version", rust_version.ok_or("the workspace's manifest names no rust-version")?);
    for (key, variable) in [("componentize_py", "COMPONENTIZE_PY"), ("componentize_js", "COMPONENTIZE_JS"), ("zig", "ZIGLANG")] {
        vars.insert(key, pinned_version(variable)?);
    }
    Ok(vars)
}

/// A toolchain version pinned in `scripts/toolchains.sh` (`NAME=VERSION`).
fn pinned_version(variable: &str) -> Result<String, String> {
    embedded::TOOLCHAINS_SCRIPT
        .lines()
        .find_map(|line| line.strip_prefix(variable)?.strip_prefix('='))
        .map(|rest| rest.split_whitespace().next().unwrap_or_default().to_string())
        .filter(|version| !version.is_empty())
        .ok_or_else(|| format!("scripts/toolchains.sh pins no {variable}"))
}

/// Replace every `{{key}}` of `template`; an unknown key is an error.
fn fill(template: &str, vars: &BTreeMap<&'static str, String>, what: &str) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("{{") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find("}}").ok_or_else(|| format!("{what}: an unclosed {{{{"))?;
        let key = &after[..end];
        let value = vars.get(key).ok_or_else(|| format!("{what}: unknown placeholder {{{{{key}}}}}"))?;
        out.push_str(value);
        rest = &after[end + 2..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The README: the common template with the language's sections put in.
fn readme(lang: Lang) -> Result<String, String> {
    let mut parts = BTreeMap::new();
    let mut current: Option<&str> = None;
    for line in lang.readme_parts().lines() {
        if let Some(name) = line.strip_prefix("<!-- ").and_then(|l| l.strip_suffix(" -->")) {
            current = Some(name);
            parts.insert(name, String::new());
        } else if let Some(name) = current {
            let part = parts.get_mut(name).expect("inserted");
            part.push_str(line);
            part.push('\n');
        }
    }
    let mut text = include_str!("../scaffold/README.md").to_string();
    for name in ["files", "install", "guide", "cost"] {
        let part = parts.get(name).ok_or_else(|| format!("the {} README has no `{name}` part", lang.key()))?;
        text = text.replace(&format!("{{{{{name}}}}}"), part.trim_end());
    }
    Ok(text)
}

/// The SDK's manifest made standalone: each `KEY.workspace = true` replaced by the
/// workspace's value for it (from `[workspace.package]` in the `[package]` table, from
/// `[workspace.dependencies]` in the others).
fn sdk_manifest() -> Result<String, String> {
    let package = workspace_table("workspace.package");
    let dependencies = workspace_table("workspace.dependencies");
    let mut out = format!(
        "# The Yardmaster Rust SDK, vendored by `yardmaster policy new` from yardmaster {}:\n\
         # its manifest, with the values it took from Yardmaster's workspace written in.\n",
        env!("CARGO_PKG_VERSION")
    );
    let mut section = String::new();
    for line in embedded::SDK_MANIFEST.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') {
            section = trimmed.to_string();
        }
        if let Some(key) = trimmed.strip_suffix(".workspace = true") {
            let table = if section == "[package]" { &package } else { &dependencies };
            let value = table.get(key).ok_or_else(|| format!("sdk/Cargo.toml: the workspace has no value for {key}"))?;
            out.push_str(&format!("{key} = {value}\n"));
        } else if trimmed.contains("workspace") && !trimmed.starts_with('#') {
            return Err(format!("sdk/Cargo.toml: cannot make this line standalone: {trimmed}"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    Ok(out)
}

/// The `KEY = VALUE` lines of a table of the workspace's manifest (values as written).
fn workspace_table(name: &str) -> BTreeMap<String, String> {
    let mut table = BTreeMap::new();
    let mut inside = false;
    for line in embedded::WORKSPACE_MANIFEST.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == format!("[{name}]");
        } else if inside {
            if let Some((key, value)) = line.split_once('=') {
                table.insert(key.trim().to_string(), value.trim().to_string());
            }
        }
    }
    table
}

/// The Zig example's `abi.zig` with a header about the project instead of the example.
fn zig_abi() -> Result<String, String> {
    let source = embedded::ZIG_ABI;
    let first = source.lines().next().unwrap_or_default();
    if !first.contains(&format!("yardmaster:policy@{ZIG_CONTRACT}")) {
        return Err(format!("policy-examples/zig/abi.zig no longer describes contract {ZIG_CONTRACT}: {first}"));
    }
    let body: Vec<&str> = source.lines().skip_while(|line| line.starts_with("//!")).collect();
    Ok(format!(
        "//! The WIT types of `yardmaster:policy@{ZIG_CONTRACT}` (wit/{ZIG_CONTRACT}/policy.wit) as the\n\
         //! component model's canonical ABI lays them out in linear memory on wasm32. An `extern\n\
         //! struct` has C layout, which for these records is exactly the canonical one: fields in\n\
         //! order, each at its natural alignment; `bool` and enums are one byte; strings and lists\n\
         //! are a (pointer, length) pair; an `option` or a variant is a one-byte discriminant\n\
         //! followed by its payload at the payload's alignment. Only what a policy reads or\n\
         //! writes is spelled out; unused cases are sized by a padding member. The table\n\
         //! `canonical_layouts` at the end states every type's canonical size, alignment and field\n\
         //! offsets, and the comptime block checks the structs against it. (Written by\n\
         //! `yardmaster policy new` from yardmaster {}, whose tests check the table against the WIT.)\n{}\n",
        env!("CARGO_PKG_VERSION"),
        body.join("\n")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [Lang; 4] = [Lang::Rust, Lang::Python, Lang::Js, Lang::Zig];

    #[test]
    fn every_project_fills_every_placeholder_and_names_only_its_own_files() {
        for lang in ALL {
            let files = project(lang, "my-policy").unwrap_or_else(|e| panic!("{lang:?}: {e}"));
            for file in &files {
                assert!(!file.contents.contains("{{"), "{lang:?} {}: a placeholder is left", file.path);
                // The project's files are about the project, not about this repository.
                if !file.path.starts_with("sdk/") && !file.path.starts_with("wit/") {
                    for repository_path in ["policy-examples", "../../", "crates/", "deadline-scaler", "deadline_scaler"] {
                        assert!(!file.contents.contains(repository_path), "{lang:?} {} mentions {repository_path}", file.path);
                    }
                }
            }
            let paths: Vec<&str> = files.iter().map(|f| f.path.as_str()).collect();
            for expected in ["README.md", "build.sh", "test.sh", ".gitignore"] {
                assert!(paths.contains(&expected), "{lang:?}: {paths:?}");
            }
            assert!(paths.contains(&format!("wit/{}/policy.wit", lang.contract()).as_str()), "{lang:?}: {paths:?}");
        }
    }

    #[test]
    fn the_rust_project_carries_the_sdk_standalone() {
        let files = project(Lang::Rust, "p").unwrap();
        let manifest = &files.iter().find(|f| f.path == "sdk/Cargo.toml").unwrap().contents;
        assert!(!manifest.lines().any(|l| l.contains("workspace") && !l.starts_with('#')), "{manifest}");
        assert!(manifest.contains("wit-bindgen = {"), "{manifest}");
        assert!(manifest.contains(&format!("version = \"{}\"", env!("CARGO_PKG_VERSION"))), "{manifest}");
        for (path, _) in embedded::SDK_SOURCES {
            assert!(files.iter().any(|f| f.path == format!("sdk/src/{path}")), "{path}");
        }
        // The SDK's bindings read the WIT the project carries.
        let bindings = &files.iter().find(|f| f.path == "sdk/src/bindings.rs").unwrap().contents;
        assert!(bindings.contains(&format!("\"../wit/{CONTRACT_VERSION}\"")), "{bindings}");
        assert!(bindings.contains(&format!("scheduler@{CONTRACT_VERSION}")), "{bindings}");
    }

    #[test]
    fn the_rust_project_formats_as_the_sdk_is_formatted() {
        let settings = |text: &str| -> Vec<String> {
            text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')).map(str::to_owned).collect()
        };
        let files = project(Lang::Rust, "p").unwrap();
        let project_style = &files.iter().find(|f| f.path == "rustfmt.toml").unwrap().contents;
        assert_eq!(settings(project_style), settings(include_str!("../../../rustfmt.toml")));
    }

    #[test]
    fn the_zig_contract_is_accepted_by_the_host() {
        let version = yardmaster::policy::contract::ContractVersion { major: 0, minor: 1, patch: 0 };
        assert_eq!(version.to_string(), ZIG_CONTRACT);
        assert!(ACCEPTED.contains(version));
        let abi = zig_abi().unwrap();
        assert!(abi.starts_with("//! The WIT types of `yardmaster:policy@0.1.0` (wit/0.1.0/policy.wit)"));
        assert!(abi.contains("pub const canonical_layouts"));
    }

    #[test]
    fn package_names_are_valid() {
        assert_eq!(package_name("My Policy_v2"), "my-policy-v2");
        assert_eq!(package_name("2fast"), "policy-2fast");
        assert_eq!(package_name("--"), "policy");
        assert_eq!(package_name("test"), "policy-test");
        assert_eq!(package_name("édf"), "df");
    }
}
