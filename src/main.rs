//! `haunt`: one binary for the services, the harness and the checker. It parses
//! arguments and calls into the libraries; nothing else lives here.

mod bench;
mod cli;
mod guarantees_cmd;
mod matrix_cmd;
mod run_cmd;
mod services;
mod shrink_cmd;

fn main() {
    let code = cli::main();
    std::process::exit(code);
}
