//! The real `yardmaster node` binary, started for a test on a free loopback port.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;

/// A running node process, killed with SIGKILL when dropped (or by [`NodeProcess::kill`]).
pub struct NodeProcess {
    child: std::process::Child,
    /// The UDP address it printed.
    pub address: SocketAddr,
    /// The certificate fingerprint it printed (`sha256:…`).
    pub printed_pin: String,
}

impl NodeProcess {
    /// Start `yardmaster node` with a 2 s idle timeout and its TLS state in `tls_dir`,
    /// and read the two lines it prints (address, certificate).
    pub fn start(tls_dir: &Path) -> NodeProcess {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_yardmaster"))
            .args(["node", "--listen", "127.0.0.1:0", "--idle-timeout", "2", "--tls-dir"])
            .arg(tls_dir)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut line = || lines.next().expect("the node prints its address and certificate").unwrap();
        let listening = line();
        let address = listening.strip_prefix("yardmaster node listening on ").unwrap_or_else(|| panic!("{listening}")).parse().unwrap();
        let certificate = line();
        let printed_pin = certificate.strip_prefix("certificate ").unwrap().split_whitespace().next().unwrap().to_string();
        NodeProcess { child, address, printed_pin }
    }

    /// SIGKILL: no goodbye, the controller must notice.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
