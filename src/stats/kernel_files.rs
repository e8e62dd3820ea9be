//! Kernel file formats that both the stats summary ([`super::summary`]) and
//! `/metrics/cadvisor` ([`super::cadvisor`]) read: flat keyed cgroup files
//! (`memory.stat`, `cpu.stat`, `cpuacct.stat`, `memory.events`) and a
//! network namespace's `/proc/<pid>/net/dev`, with the interfaces cAdvisor
//! leaves out of network stats. Pure: file texts in, numbers out.

use std::collections::HashMap;

/// A flat-keyed cgroup file (`memory.stat`, `cpu.stat`): `key value` lines.
#[must_use]
pub fn flat_keyed(text: &str) -> HashMap<&str, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            let k = it.next()?;
            let v = it.next()?.parse().ok()?;
            Some((k, v))
        })
        .collect()
}

/// Interface name prefixes cAdvisor leaves out of network stats
/// (loopback, the host ends of pods' veth pairs, docker's and nerdctl's
/// bridges).
pub const IGNORED_INTERFACE_PREFIXES: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];

/// One network interface's counters (bytes, packets) since it came up.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Interface {
    /// Interface name (`eth0`).
    pub name: String,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Receive errors.
    pub rx_errors: u64,
    /// Received packets dropped.
    pub rx_dropped: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
    /// Send errors.
    pub tx_errors: u64,
    /// Sent packets dropped.
    pub tx_dropped: u64,
}

/// The interfaces of a `/proc/<pid>/net/dev` text, those cAdvisor ignores
/// ([`IGNORED_INTERFACE_PREFIXES`]: loopback, veths, bridges) left out; a
/// line that does not parse is skipped.
#[must_use]
pub fn net_dev(text: &str) -> Vec<Interface> {
    text.lines()
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let name = name.trim();
            if name.contains('|')
                || IGNORED_INTERFACE_PREFIXES
                    .iter()
                    .any(|p| name.starts_with(p))
            {
                return None;
            }
            let f: Vec<u64> = rest
                .split_whitespace()
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            (f.len() >= 12).then(|| Interface {
                name: name.to_string(),
                rx_bytes: f[0],
                rx_packets: f[1],
                rx_errors: f[2],
                rx_dropped: f[3],
                tx_bytes: f[8],
                tx_packets: f[9],
                tx_errors: f[10],
                tx_dropped: f[11],
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_keyed_reads_key_value_lines_and_skips_the_rest() {
        let got = flat_keyed("usage_usec 10\nuser_usec 7\n\nnr_periods x\nlonely\n");
        assert_eq!(got, HashMap::from([("usage_usec", 10), ("user_usec", 7)]));
        assert!(flat_keyed("").is_empty());
    }

    #[test]
    fn net_dev_keeps_every_counter_and_skips_loopback() {
        let text = "Inter-|   Receive                                                |  Transmit\n \
                    face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    \
                    lo: 10 1 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  \
                    eth0: 1500 12 1 2 0 0 0 0 900 9 3 4 0 0 0 0\n  \
                    eth1: 1 2\n";
        assert_eq!(
            net_dev(text),
            vec![Interface {
                name: "eth0".into(),
                rx_bytes: 1500,
                rx_packets: 12,
                rx_errors: 1,
                rx_dropped: 2,
                tx_bytes: 900,
                tx_packets: 9,
                tx_errors: 3,
                tx_dropped: 4,
            }]
        );
    }
}
