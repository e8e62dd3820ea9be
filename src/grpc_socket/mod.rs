//! gRPC servers on unix sockets, as the kubelet serves its device plugin
//! registration and pod resources APIs: the socket made anew in its
//! directory, and every connection read through [`authority::FixAuthority`]
//! so that Go clients that dial a bare socket path are answered too.

pub mod authority;

use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use tokio_stream::StreamExt as _;
use tracing::warn;

/// Why a socket could not be served.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve {socket}: {source}")]
pub struct Error {
    /// The socket's path.
    pub socket: PathBuf,
    /// What failed: making the directory, removing a stale socket, binding.
    pub source: std::io::Error,
}

/// Serves `router` on the unix socket `socket` until the task is aborted:
/// its directory is made (with `dir_mode` when new), a stale socket removed,
/// and a new one bound. `what` names the server in the log line its end
/// writes.
///
/// # Errors
/// [`Error`]: the directory, the removal or the bind failed.
pub fn serve(
    socket: &Path,
    dir_mode: u32,
    router: tonic::transport::server::Router,
    what: &'static str,
) -> Result<tokio::task::JoinHandle<()>, Error> {
    let err = |source| Error {
        socket: socket.to_path_buf(),
        source,
    };
    if let Some(dir) = socket.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(dir_mode)
            .create(dir)
            .map_err(err)?;
    }
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(err(e)),
    }
    let listener = tokio::net::UnixListener::bind(socket).map_err(err)?;
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|conn| conn.map(authority::FixAuthority::new));
    Ok(tokio::spawn(async move {
        if let Err(e) = router.serve_with_incoming(incoming).await {
            warn!(error = %e, server = what, "gRPC server stopped");
        }
    }))
}
