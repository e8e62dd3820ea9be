//! The `rustlet` command.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    rustlet::agent::main()
}
