//! Prints the Functions library a tier loads (`tierlimit_redis::library_source`),
//! for `benches/script-instructions.sh`, which loads it into a `redis-server`
//! run under valgrind.

fn main() {
    print!("{}", tierlimit_redis::library_source());
}
