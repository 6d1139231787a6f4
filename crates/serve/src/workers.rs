//! Where the server's workers live: the [`Workers`] trait, which the cluster crate
//! defines so that the local pool and remote nodes implement the same operations.

pub use yardmaster_cluster::workers::Workers;
