//! The command line as a Unix tool: a command whose stdout is closed before it writes
//! (`yardmaster … | head`) ends quietly, without a panic.

use std::process::{Command, Stdio};

#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    for args in
        [&["policy", "check", "--help"][..], &["policy", "new", "--help"], &["policy", "list"], &["--version"], &["repository", "--help"]]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the yardmaster binary starts");
        // The reader goes away before the command writes anything.
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{args:?}: {stderr}");
        use std::os::unix::process::ExitStatusExt;
        // Killed by SIGPIPE, as `cat` would be, or done (help written where it could be).
        let quiet = output.status.success() || output.status.signal() == Some(SIGPIPE);
        assert!(quiet, "{args:?}: {:?}", output.status);
    }
}

/// SIGPIPE's number on Linux.
const SIGPIPE: i32 = 13;

/// Loki's published data, beside the clone.
fn loki_data() -> std::path::PathBuf {
    std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/data/loki")).canonicalize().expect("shared data present")
}

#[test]
fn a_loki_application_named_without_a_folder_reads_its_profiles_beside_it_and_errors_name_the_file() {
    // `sim compare --pipeline app.json` failed with a bare "No such file or directory
    // (os error 2)": the profiles' folder was the empty parent of a bare file name.
    let run = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .current_dir(loki_data())
        .args(["sim", "compare", "--pipeline", "sim__traffic_analysis.json", "--policies", "fifo"])
        .args(["--workload", "poisson", "--rate", "20", "--duration", "0.5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    // Without profiles beside it, the error names the application and the file missing.
    let dir = std::env::temp_dir().join(format!("ym-bare-app-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(loki_data().join("sim__traffic_analysis.json"), dir.join("app.json")).unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_yardmaster"))
        .current_dir(&dir)
        .args(["sim", "compare", "--pipeline", "app.json", "--policies", "fifo", "--duration", "0.5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(stderr.contains("app.json") && stderr.contains("profiling__simulator_runtimes.csv"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
