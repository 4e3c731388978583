//! Prints the Functions library a tier loads (`tierlimit_redis::library_source`),
//! or with `minimal <code>` the minimal script of algorithm `code` (1 to 5,
//! `tierlimit_benches::MINIMAL_SCRIPTS`), for `benches/script-instructions.sh`,
//! which loads them into a `redis-server` run under valgrind.

use std::process::ExitCode;

use tierlimit_benches::MINIMAL_SCRIPTS;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => print!("{}", tierlimit_redis::library_source()),
        [what, code] if what == "minimal" => {
            let Some(script) = code
                .parse::<usize>()
                .ok()
                .and_then(|c| c.checked_sub(1))
                .and_then(|i| MINIMAL_SCRIPTS.get(i))
            else {
                eprintln!("library-source: no algorithm {code:?} (1 to 5)");
                return ExitCode::FAILURE;
            };
            print!("{script}");
        }
        _ => {
            eprintln!("usage: library-source [minimal <algorithm code>]");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
