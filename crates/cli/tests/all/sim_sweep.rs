//! `yardmaster sim sweep` on the built binary: the cells it runs, the files it writes
//! (CSV, JSON, a heatmap per policy), goodput never above the optimal bound, and
//! `--strict` failing on the cliff a non-scaling policy shows past capacity, unless the
//! policy's doc gives it as where it breaks.

use std::process::Command;

use super::serve_end_to_end::scratch;

#[test]
fn a_small_sweep_writes_its_table_files_and_heatmaps_and_strict_fails_on_a_cliff() {
    let dir = scratch("sweep");
    let out = dir.join("out");
    // FIFO under another name: its cliff is documented for `fifo`, not for this file.
    let undocumented = dir.join("no-drops.wasm");
    std::fs::write(&undocumented, yardmaster_policy_artifacts::shipped("fifo").unwrap().bytes).unwrap();
    let sweep = |policies: &std::ffi::OsStr, out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["sim", "sweep", "--policies"])
            .arg(policies)
            .args(["--pipelines", "vision-chain", "--loads", "0.5,1.5"])
            .args(["--shapes", "poisson", "--seeds", "1", "--duration", "1", "--strict", "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    // fifo and edf do not scale: past capacity their goodput falls off, where their
    // docs say it does (labelled, and --strict passes).
    let run = sweep("fifo,edf".as_ref(), &dir.join("documented"));
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(stdout.contains("cliff (doc)") && stdout.contains("fifo, 1 rows: never drops"), "{stdout}");
    assert!(stdout.contains("cliffs (goodput under 0.9 of the best at a lower load): 0"), "{stdout}");
    assert_eq!(run.status.code(), Some(0), "--strict passes a documented cliff:\n{stdout}\n{stderr}");
    // --replot runs nothing and judges the saved cells again: the same table and files.
    let replot = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "sweep", "--strict", "--replot"])
        .arg(dir.join("documented/sweep.json"))
        .arg("--out")
        .arg(dir.join("replotted"))
        .output()
        .unwrap();
    let replotted = String::from_utf8_lossy(&replot.stdout);
    assert_eq!(replot.status.code(), Some(0), "{replotted}");
    assert!(replotted.contains("fifo, 1 rows: never drops"), "{replotted}");
    for file in ["sweep.json", "sweep.csv", "heatmap-fifo.svg", "heatmap-edf.svg"] {
        assert!(dir.join("replotted").join(file).is_file(), "{file} written");
    }
    let mut policies = undocumented.clone().into_os_string();
    policies.push(",edf");
    let run = sweep(&policies, &out);
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(stderr.contains("sweeping 4 runs"), "{stderr}");
    assert!(stderr.contains("[4/4]"), "progress per run: {stderr}");
    assert!(stdout.contains("cliffs (goodput under 0.9"), "{stdout}");
    // The same cliff from a policy whose doc does not give it is what --strict fails on.
    assert!(stdout.contains("CLIFF") && stdout.contains("no-drops on vision-chain poisson at 1.5×"), "{stdout}");
    assert_eq!(run.status.code(), Some(1), "--strict fails on a cliff:\n{stdout}\n{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("sweep.json")).unwrap()).unwrap();
    let cells = json["cells"].as_array().unwrap();
    assert_eq!(cells.len(), 4);
    for cell in cells {
        let of_bound = cell["goodput_of_bound"].as_f64().unwrap();
        assert!(of_bound > 0.0 && of_bound <= 1.0 + 1e-9, "goodput never exceeds the bound: {cell}");
        assert!(cell["fuel_per_event"].as_f64().unwrap() > 0.0, "the policy's cost in fuel: {cell}");
        assert!(cell["attainment"]["main"].is_number() || cell["attainment"].as_object().is_some_and(|a| !a.is_empty()), "{cell}");
    }
    let low = cells.iter().find(|c| c["policy"] == "edf" && c["load"] == 0.5).unwrap();
    assert!(low["on_time"].as_f64().unwrap() > 0.99, "half the capacity is served on time: {low}");
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "a header and one line per run:\n{csv}");
    for policy in ["no-drops", "edf"] {
        let svg = std::fs::read_to_string(out.join(format!("heatmap-{policy}.svg"))).unwrap();
        assert!(svg.contains("vision-chain") && svg.contains("1.5×"), "rows and columns are labelled");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_random_application_sweep_writes_its_applications_and_names_each_row_by_its_shape() {
    let dir = scratch("sweep-random");
    let loki = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki"));
    let sweep = |out: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["sim", "sweep", "--random-apps", "3", "--app-seed", "5", "--loki-data"])
            .arg(loki)
            .args(["--policies", "edf", "--loads", "0.25", "--shapes", "poisson", "--seeds", "1", "--duration", "1", "--out"])
            .arg(out)
            .output()
            .unwrap()
    };
    let (a, b) = (dir.join("a"), dir.join("b"));
    let run = sweep(&a);
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("sweeping 3 runs"), "only the generated applications: {stderr}");
    let names = ["r00-chain", "r01-root-fan", "r02-root-fan-join"];
    for name in names {
        assert!(stdout.contains(name), "{name}: {stdout}");
        assert!(a.join("apps").join(format!("{name}.json")).exists(), "{name} written");
    }
    let svg = std::fs::read_to_string(a.join("heatmap-edf.svg")).unwrap();
    assert!(names.iter().all(|n| svg.contains(n)), "one row per application, named by its shape");
    // An application reruns on its own with `sim compare`: its profiles are beside it.
    let compare = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "compare", "--pipeline"])
        .arg(a.join("apps/r01-root-fan.json"))
        .args(["--policies", "edf", "--workload", "poisson", "--rate", "20", "--duration", "1", "--out"])
        .arg(dir.join("compare"))
        .output()
        .unwrap();
    assert!(compare.status.success(), "{}", String::from_utf8_lossy(&compare.stderr));
    // The same seed draws the same applications.
    assert!(sweep(&b).status.success());
    for name in names {
        let read = |d: &std::path::Path| std::fs::read_to_string(d.join("apps").join(format!("{name}.json"))).unwrap();
        assert_eq!(read(&a), read(&b), "{name}");
    }
    // A missing profile folder is named.
    let run = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "sweep", "--random-apps", "1", "--loki-data", "/no/such/loki", "--out"])
        .arg(dir.join("c"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success() && stderr.contains("/no/such/loki"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_small_random_application_sweep_of_the_reference_policies_holds_strictly() {
    // CI's random-application sweep: two applications nobody chose (seed 1: a chain of
    // three tasks, and a detector fanning out into two branches), the four reference
    // policies, a quarter of the capacity bound, the bound and twice it, 5 s each.
    // `--strict` fails on any cliff or low-load miss. It failed before issue 43's
    // fixes: Loki ran out of an event call's fuel on the fan-out from 0.5× on (a cliff
    // at 1×, 0.01 of its best below).
    let dir = scratch("sweep-random-strict");
    let loki = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki"));
    let run = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .args(["sim", "sweep", "--random-apps", "2", "--app-seed", "1", "--loki-data"])
        .arg(loki)
        .args(["--policies", "pard,flex,quart,loki", "--loads", "0.25,1,2", "--shapes", "poisson", "--seeds", "1"])
        .args(["--duration", "5", "--strict", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr));
    assert!(stderr.contains("sweeping 24 runs"), "{stderr}");
    assert!(stdout.contains("r00-chain") && stdout.contains("r01-root-fan"), "{stdout}");
    assert!(stdout.contains("cliffs (goodput under 0.9 of the best at a lower load): 0"), "{stdout}");
    assert!(stdout.contains("low-load misses (Poisson ≤ 0.5×, under 0.99 on time): 0"), "{stdout}");
    assert_eq!(run.status.code(), Some(0), "--strict:\n{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}
