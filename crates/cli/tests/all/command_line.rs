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
