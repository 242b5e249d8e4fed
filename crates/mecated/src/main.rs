//! The `mecated` binary: the session server and its operator commands
//! (`mecated --help`).

fn main() -> std::process::ExitCode {
    mecated::cli::main()
}
