//! placeholder until helpers land
