//! Reads one pod's sandboxes and containers from CRI by the
//! `io.kubernetes.pod.uid` label: the kubelet's `GetPodStatus`.

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;

use crate::container::state::{Container, ContainerState, PodRuntime, Sandbox};
use crate::cri::{
    CONTAINER_HASH_ANNOTATION, POD_UID_LABEL, Result, Runtime, TERMINATION_MESSAGE_PATH_ANNOTATION,
    TERMINATION_MESSAGE_POLICY_ANNOTATION,
};

fn ts(nanos: i64) -> Option<Timestamp> {
    (nanos > 0)
        .then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok())
        .flatten()
}

/// Converts a CRI sandbox status into [`Sandbox`].
#[must_use]
pub fn sandbox_from(s: &cri::PodSandboxStatus) -> Sandbox {
    let mut ips: Vec<String> = Vec::new();
    if let Some(n) = &s.network {
        if !n.ip.is_empty() {
            ips.push(n.ip.clone());
        }
        ips.extend(n.additional_ips.iter().map(|p| p.ip.clone()));
    }
    Sandbox {
        id: s.id.clone(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        ready: s.state == cri::PodSandboxState::SandboxReady as i32,
        created_at: ts(s.created_at).unwrap_or_default(),
        ips,
    }
}

/// Most bytes of a termination message file that are reported (the kubelet's
/// `MaxContainerTerminationMessageLength`, 4 KiB).
pub const MAX_TERMINATION_MESSAGE_BYTES: usize = 4 * 1024;
/// Most log lines and bytes used as a termination message under
/// `FallbackToLogsOnError` (80 lines, 2 KiB).
pub const MAX_TERMINATION_LOG_LINES: usize = 80;
/// See [`MAX_TERMINATION_LOG_LINES`].
pub const MAX_TERMINATION_LOG_BYTES: usize = 2 * 1024;

fn last_bytes(mut v: Vec<u8>, max: usize) -> String {
    if v.len() > max {
        v.drain(..v.len() - max);
    }
    String::from_utf8_lossy(&v).into_owned()
}

/// The text of the last `lines` lines of a container log (CRI or Docker
/// JSON format; partial lines joined, a partial last line kept without its
/// newline), at most its last `max` bytes: the kubelet's
/// `readLastStringFromContainerLogs`. Lines that do not parse are skipped.
#[must_use]
pub fn log_tail(log: &[u8], lines: usize, max: usize) -> String {
    let json = log
        .split_inclusive(|b| *b == b'\n')
        .next()
        .is_some_and(crate::cri::log::is_json);
    // Whole lines, each with its partial beginnings joined on.
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut partial: Vec<u8> = Vec::new();
    for line in log.split_inclusive(|b| *b == b'\n') {
        let Ok(msg) = crate::cri::log::parse_line(line, json) else {
            continue;
        };
        partial.extend_from_slice(&msg.content);
        if partial.ends_with(b"\n") {
            out.push(std::mem::take(&mut partial));
        }
    }
    let start = out.len().saturating_sub(lines);
    let mut text: Vec<u8> = out[start..].concat();
    text.extend_from_slice(&partial);
    last_bytes(text, max)
}

/// The termination message of an exited container, as the kubelet's
/// `getTerminationMessage`: the file mounted at its `terminationMessagePath`,
/// else (policy `FallbackToLogsOnError` and a non-zero exit) the end of its log.
fn termination_message(s: &cri::ContainerStatus) -> String {
    let path = s.annotations.get(TERMINATION_MESSAGE_PATH_ANNOTATION);
    let fallback = s
        .annotations
        .get(TERMINATION_MESSAGE_POLICY_ANNOTATION)
        .map(String::as_str)
        == Some("FallbackToLogsOnError")
        && s.exit_code != 0;
    let from_file = path
        .and_then(|p| s.mounts.iter().find(|m| &m.container_path == p))
        .and_then(|m| std::fs::read(&m.host_path).ok())
        .map(|data| last_bytes(data, MAX_TERMINATION_MESSAGE_BYTES))
        .unwrap_or_default();
    if from_file.is_empty() && fallback {
        let log = std::fs::read(&s.log_path).unwrap_or_default();
        return log_tail(&log, MAX_TERMINATION_LOG_LINES, MAX_TERMINATION_LOG_BYTES);
    }
    from_file
}

/// Converts a CRI container status into [`Container`].
#[must_use]
pub fn container_from(s: &cri::ContainerStatus, sandbox_id: &str) -> Container {
    let state = match cri::ContainerState::try_from(s.state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    Container {
        id: s.id.clone(),
        name: s
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default(),
        attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
        sandbox_id: sandbox_id.to_string(),
        state,
        created_at: ts(s.created_at).unwrap_or_default(),
        started_at: ts(s.started_at),
        finished_at: ts(s.finished_at),
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: if state == ContainerState::Exited {
            let written = termination_message(s);
            match (s.message.is_empty(), written.is_empty()) {
                (_, true) => s.message.clone(),
                (true, false) => written,
                (false, false) => format!("{}: {written}", s.message),
            }
        } else {
            s.message.clone()
        },
        image: s
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default(),
        image_ref: s.image_ref.clone(),
        hash: s
            .annotations
            .get(CONTAINER_HASH_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
    }
}

/// Everything the runtime holds for the pod with `uid`: one ListPodSandbox, one
/// ListContainers, then a status call for each ready sandbox (its IPs) and each container.
///
/// # Errors
/// The first CRI call that fails.
pub async fn observe(runtime: &Runtime, uid: &str) -> Result<PodRuntime> {
    let by_uid = HashMap::from([(POD_UID_LABEL.to_string(), uid.to_string())]);
    let (sandboxes, containers) = tokio::try_join!(
        runtime.list_pod_sandboxes(by_uid.clone()),
        runtime.list_containers(by_uid)
    )?;
    let sandbox_futs = sandboxes.iter().map(|s| async move {
        if s.state == cri::PodSandboxState::SandboxReady as i32
            && let Some(st) = runtime.pod_sandbox_status(&s.id).await?
        {
            return Ok(sandbox_from(&st));
        }
        Ok(Sandbox {
            id: s.id.clone(),
            attempt: s.metadata.as_ref().map_or(0, |m| m.attempt),
            ready: s.state == cri::PodSandboxState::SandboxReady as i32,
            created_at: ts(s.created_at).unwrap_or_default(),
            ips: vec![],
        })
    });
    let container_futs = containers.iter().map(|c| async move {
        Ok::<_, crate::cri::Error>(
            runtime
                .container_status(&c.id)
                .await?
                .map(|st| container_from(&st, &c.pod_sandbox_id)),
        )
    });
    let (sandboxes, containers) = tokio::try_join!(
        futures::future::try_join_all(sandbox_futs),
        futures::future::try_join_all(container_futs)
    )?;
    let mut rt = PodRuntime {
        sandboxes,
        containers: containers.into_iter().flatten().collect(),
    };
    rt.sort();
    Ok(rt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_joins_partials_and_keeps_the_end() {
        let log = "2024-01-01T00:00:00Z stdout F one\n\
                   2024-01-01T00:00:01Z stderr P tw\n\
                   2024-01-01T00:00:02Z stderr F o\n\
                   2024-01-01T00:00:03Z stdout F three\n";
        let log = log.as_bytes();
        assert_eq!(log_tail(log, 80, 2048), "one\ntwo\nthree\n");
        assert_eq!(log_tail(log, 2, 2048), "two\nthree\n");
        assert_eq!(log_tail(log, 80, 4), "ree\n");
        let unterminated = b"2024-01-01T00:00:00Z stdout P DONE\n";
        assert_eq!(log_tail(unterminated, 80, 2048), "DONE");
        let json = br#"{"log":"a\n","stream":"stdout","time":"2024-01-01T00:00:00Z"}
{"log":"b\n","stream":"stderr","time":"2024-01-01T00:00:01Z"}
"#;
        assert_eq!(log_tail(json, 1, 2048), "b\n");
        assert_eq!(log_tail(b"garbage\n", 80, 2048), "");
    }

    #[test]
    fn termination_message_from_file_or_logs() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("msg");
        let log = dir.path().join("0.log");
        std::fs::write(&log, "2024-01-01T00:00:00Z stderr F boom\n").unwrap();
        let mut st = cri::ContainerStatus {
            exit_code: 1,
            log_path: log.to_string_lossy().into_owned(),
            annotations: [
                (
                    TERMINATION_MESSAGE_PATH_ANNOTATION.to_string(),
                    "/dev/termination-log".to_string(),
                ),
                (
                    TERMINATION_MESSAGE_POLICY_ANNOTATION.to_string(),
                    "FallbackToLogsOnError".to_string(),
                ),
            ]
            .into(),
            mounts: vec![cri::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: file.to_string_lossy().into_owned(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            termination_message(&st),
            "boom\n",
            "no file: fall back to the log"
        );
        std::fs::write(&file, "written by the app").unwrap();
        assert_eq!(termination_message(&st), "written by the app");
        std::fs::write(&file, "").unwrap();
        st.exit_code = 0;
        assert_eq!(termination_message(&st), "", "exit 0: no fallback");
    }
}
