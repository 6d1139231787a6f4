//! Where the controller finds its nodes: a fixed list (`static:ADDR,…`) or a DNS name
//! resolved again every few seconds (`dns:NAME:PORT`).
//!
//! On Kubernetes the name is a headless Service's: its DNS record holds one A (or
//! AAAA) record per *ready* node pod, so the controller learns of joins and leaves
//! without any permission on the API server. Names are resolved by the system's
//! resolver (`getaddrinfo`), so `/etc/resolv.conf`'s search domains and `ndots` apply
//! exactly as for every other program in the pod.
//!
//! [`Membership`] turns successive resolutions into what changed: addresses that
//! appeared (nodes to connect to) and addresses that disappeared (nodes to drain).

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;

use anyhow::{anyhow, bail, Context, Result};

/// Where the nodes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSource {
    /// A fixed list of addresses.
    Static(Vec<SocketAddr>),
    /// A DNS name, every address it resolves to, at one port.
    Dns {
        /// The name (a headless Service's, e.g. `nodes.default.svc.cluster.local`).
        name: String,
        /// The nodes' UDP port.
        port: u16,
    },
}

impl FromStr for NodeSource {
    type Err = anyhow::Error;

    /// `static:ADDR,ADDR,…` (each `IP:PORT`) or `dns:NAME:PORT`.
    fn from_str(text: &str) -> Result<Self> {
        if let Some(list) = text.strip_prefix("static:") {
            let addresses = list
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(|a| a.parse::<SocketAddr>().with_context(|| format!("node address {a:?} in {text:?} is not IP:PORT")))
                .collect::<Result<Vec<_>>>()?;
            if addresses.is_empty() {
                bail!("{text:?} lists no node address (static:IP:PORT,IP:PORT,…)");
            }
            return Ok(NodeSource::Static(addresses));
        }
        if let Some(rest) = text.strip_prefix("dns:") {
            let (name, port) = rest.rsplit_once(':').ok_or_else(|| anyhow!("{text:?} has no port (dns:NAME:PORT)"))?;
            let port: u16 = port.parse().with_context(|| format!("the port in {text:?} is not a number from 1 to 65535"))?;
            if port == 0 {
                bail!("the port in {text:?} is 0");
            }
            let valid = !name.is_empty()
                && name.len() <= 253
                && name.trim_end_matches('.').split('.').all(|label| {
                    !label.is_empty()
                        && label.len() <= 63
                        && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !label.starts_with('-')
                        && !label.ends_with('-')
                });
            if !valid {
                bail!("{name:?} in {text:?} is not a DNS name");
            }
            return Ok(NodeSource::Dns { name: name.to_string(), port });
        }
        bail!("nodes {text:?}: expected dns:NAME:PORT (a headless Service) or static:IP:PORT,…")
    }
}

impl fmt::Display for NodeSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeSource::Static(addresses) => {
                let list: Vec<String> = addresses.iter().map(SocketAddr::to_string).collect();
                write!(f, "static:{}", list.join(","))
            }
            NodeSource::Dns { name, port } => write!(f, "dns:{name}:{port}"),
        }
    }
}

impl NodeSource {
    /// The addresses of the nodes now: the list, or what the name resolves to (sorted,
    /// without repeats). A name that does not resolve is an error naming it; a name
    /// with no address yet is an empty list where the resolver says so.
    pub async fn resolve(&self) -> Result<BTreeSet<SocketAddr>> {
        match self {
            NodeSource::Static(addresses) => Ok(addresses.iter().copied().collect()),
            NodeSource::Dns { name, port } => {
                let found =
                    tokio::net::lookup_host((name.as_str(), *port)).await.with_context(|| format!("resolving the node name {name}"))?;
                Ok(found.collect())
            }
        }
    }

    /// The DNS name node certificates are checked against by default: the resolved
    /// name itself (its certificate should also carry `*.NAME` for the pods' own
    /// names); `None` for a static list.
    pub fn default_node_name(&self) -> Option<&str> {
        match self {
            NodeSource::Dns { name, .. } => Some(name.trim_end_matches('.')),
            NodeSource::Static(_) => None,
        }
    }
}

/// What changed between two looks at the nodes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Addresses seen now and not before: nodes to connect to.
    pub appeared: Vec<SocketAddr>,
    /// Addresses seen before and not now: nodes leaving.
    pub vanished: Vec<SocketAddr>,
}

/// The addresses last seen, and what each new look changes.
#[derive(Debug, Clone, Default)]
pub struct Membership {
    seen: BTreeSet<SocketAddr>,
}

impl Membership {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Take `now` as the addresses seen; what appeared and vanished since the last
    /// look.
    pub fn update(&mut self, now: BTreeSet<SocketAddr>) -> Changes {
        let appeared = now.difference(&self.seen).copied().collect();
        let vanished = self.seen.difference(&now).copied().collect();
        self.seen = now;
        Changes { appeared, vanished }
    }

    /// Forget `address` (its node was lost): the next look that sees it connects again.
    pub fn forget(&mut self, address: SocketAddr) {
        self.seen.remove(&address);
    }

    /// The addresses seen at the last look.
    pub fn seen(&self) -> &BTreeSet<SocketAddr> {
        &self.seen
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_sources_parse_and_print_back() {
        let dns: NodeSource = "dns:nodes.default.svc.cluster.local:7443".parse().unwrap();
        assert_eq!(dns, NodeSource::Dns { name: "nodes.default.svc.cluster.local".into(), port: 7443 });
        assert_eq!(dns.to_string(), "dns:nodes.default.svc.cluster.local:7443");
        assert_eq!(dns.default_node_name(), Some("nodes.default.svc.cluster.local"));
        let list: NodeSource = "static:127.0.0.2:7443, [::1]:7444".parse().unwrap();
        assert_eq!(list.to_string(), "static:127.0.0.2:7443,[::1]:7444");
        assert_eq!(list.default_node_name(), None);
    }

    #[test]
    fn bad_node_sources_say_what_is_wrong() {
        let error = |text: &str| text.parse::<NodeSource>().unwrap_err().to_string();
        assert!(error("nodes.svc:7443").contains("expected dns:NAME:PORT"), "{}", error("nodes.svc:7443"));
        assert!(error("dns:nodes.svc").contains("has no port"), "{}", error("dns:nodes.svc"));
        assert!(error("dns:nodes.svc:x").contains("not a number"));
        assert!(error("dns:nodes.svc:0").contains("is 0"));
        assert!(error("dns:bad_name.svc:7443").contains("not a DNS name"));
        assert!(error("dns:-x.svc:7443").contains("not a DNS name"));
        assert!(error("static:").contains("no node address"));
        assert!(error("static:10.0.0.1").contains("not IP:PORT"));
    }

    #[test]
    fn membership_reports_what_appeared_and_vanished() {
        let set = |ports: &[u16]| ports.iter().map(|&p| SocketAddr::from(([127, 0, 0, 1], p))).collect::<BTreeSet<_>>();
        let mut membership = Membership::new();
        let first = membership.update(set(&[1, 2, 3]));
        assert_eq!(first.appeared.len(), 3);
        assert!(first.vanished.is_empty());
        assert_eq!(membership.update(set(&[1, 2, 3])), Changes::default());
        let changed = membership.update(set(&[1, 3, 4]));
        assert_eq!(changed.appeared, vec![SocketAddr::from(([127, 0, 0, 1], 4))]);
        assert_eq!(changed.vanished, vec![SocketAddr::from(([127, 0, 0, 1], 2))]);
        membership.forget(SocketAddr::from(([127, 0, 0, 1], 3)));
        assert_eq!(membership.update(set(&[1, 3, 4])).appeared, vec![SocketAddr::from(([127, 0, 0, 1], 3))]);
    }

    #[tokio::test]
    async fn a_static_list_resolves_to_itself_and_a_numeric_name_through_the_resolver() {
        let list: NodeSource = "static:127.0.0.2:7443,127.0.0.3:7443".parse().unwrap();
        assert_eq!(list.resolve().await.unwrap().len(), 2);
        let name = NodeSource::Dns { name: "localhost".into(), port: 7443 };
        let found = name.resolve().await.unwrap();
        assert!(found.iter().all(|a| a.ip().is_loopback() && a.port() == 7443), "{found:?}");
    }
}
