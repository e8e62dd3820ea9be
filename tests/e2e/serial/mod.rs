//! The topics that must run alone, one test at a time, after every other
//! topic: they restart the agent ([`restart`], [`eviction`], [`devices`],
//! [`client_cert`], [`cpu_manager`], [`credential_provider`], [`pids`], [`hugepages`], [`reserved`], [`api_rate`], [`node_limits`], [`dra`], [`node_shutdown`], [`otel`]), change the node's eviction thresholds ([`node_configuration`]), add a node of their own ([`image_gc`]), take most of the
//! node's cpu ([`admission`]), measure the agent's memory and the API
//! server's TokenReviews under load ([`hostile_nodeapi`]) or the agent's
//! peak memory ([`hostile_bounded`]: other topics' pods would add to it),
//! deploy the CSI driver that [`crate::csi`] runs on the host under the same
//! name ([`csi_in_cluster`]) or run that driver themselves
//! ([`hostile_fsgroup`]), or assert that
//! the Node is not written while nothing on the node changes, or restart
//! the agent ([`node_status`]).

mod admission;
mod api_rate;
mod client_cert;
mod cpu_manager;
mod credential_provider;
mod csi_in_cluster;
mod devices;
mod dra;
mod eviction;
mod hostile_bounded;
mod hostile_fsgroup;
mod hostile_nodeapi;
mod hugepages;
mod image_gc;
mod node_configuration;
mod node_limits;
mod node_shutdown;
mod node_status;
mod otel;
mod pids;
mod reserved;
mod restart;
