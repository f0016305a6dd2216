//! Where a peer's server runs: in the peer process beside its client (the default), or in a
//! child process of its own (`--separate-processes`, how services run), connected over
//! loopback TCP or a Unix socket.
//!
//! With `--separate-processes` the peer starts itself again with `--server-only` (same other
//! arguments); that child binds its server, prints `listening ADDR` and then serves until its
//! stdin closes (so it never outlives the peer, even one killed with -9). Over that same pipe
//! the client process switches the child's allocation counter on and off and reads its counts;
//! the child's CPU time is read through its CPU-time clock (`clock_getcpuclockid`). So CPU and
//! allocations per call stay client + server in both placements.
//!
//! A peer's command line flattens [`Placement`] into its own (clap) arguments and hands it to
//! [`init`] first; then its `main` does:
//! ```ignore
//! let addr = match placement::separate_server() {
//!     Some(a) => a,                  // the server is a child process at `a`
//!     None => {
//!         let a = start_server();    // on its own runtime/threads, as before
//!         placement::server_only(&a); // with --server-only: serve until stdin closes, exit
//!         a
//!     }
//! };
//! ```

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};

/// The flag that puts the server in a child process.
pub const SEPARATE: &str = "--separate-processes";
/// The flag the child is started with.
pub const SERVER_ONLY: &str = "--server-only";

struct ServerChild {
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    line: String,
}

static CHILD: OnceLock<Option<Mutex<ServerChild>>> = OnceLock::new();
static CHILD_PID: AtomicI32 = AtomicI32::new(0);

/// The placement flags every peer accepts (`#[command(flatten)]` into its arguments).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct Placement {
    /// The server in a child process of its own (this program again, with --server-only),
    /// over loopback TCP or a Unix socket; default: in this process beside the client
    #[arg(long = "separate-processes")]
    pub separate: bool,
    /// Run as that child: bind the server, print `listening ADDR`, serve until stdin closes
    #[arg(long = "server-only", hide_short_help = true)]
    pub server_only: bool,
}

static PLACEMENT: OnceLock<Placement> = OnceLock::new();

/// Sets this process's placement (from its parsed arguments); call it before anything else of
/// this module.
pub fn init(p: Placement) {
    let _ = PLACEMENT.set(p);
}

fn placement() -> Placement {
    *PLACEMENT
        .get()
        .expect("placement::init with the parsed arguments first")
}

/// True when this process was started with `--separate-processes`.
pub fn is_separate() -> bool {
    placement().separate
}

/// True when this process is a server-only child.
pub fn is_server_only() -> bool {
    placement().server_only
}

/// With `--separate-processes`: starts (once) the server child and returns the address it
/// listens on, in the peer's own notation (`127.0.0.1:P`, a socket path, a URI). `None` when the
/// server is to run in this process.
///
/// Panics when the child cannot be started: a peer that cannot set up its server cannot run.
pub fn separate_server() -> Option<String> {
    if !is_separate() || is_server_only() {
        return None;
    }
    let exe = std::env::current_exe().expect("own executable");
    // The same arguments, passed on as they came, less the one that made the child.
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != SEPARATE)
        .chain(std::iter::once(SERVER_ONLY.into()))
        .collect();
    Some(start_child(Command::new(exe).args(&args)))
}

/// Starts another program as this peer's server process — one that speaks the `--server-only`
/// protocol of this module (prints `listening ADDR`, serves until its stdin closes, answers
/// `count on`, `count off` and `allocs`), such as the grpc-go peer with `--server-only` — and
/// returns the address it listens on. Its CPU time and allocations then count as the server's,
/// as with [`separate_server`]. At most one server process per peer.
///
/// Panics when the program cannot be started: a peer without its server cannot run.
pub fn external_server(program: &std::path::Path, args: &[&str]) -> String {
    assert!(
        !is_server_only(),
        "a --server-only child does not start servers of its own"
    );
    start_child(Command::new(program).args(args))
}

/// Starts the server child (once) and returns the address it announced.
fn start_child(cmd: &mut Command) -> String {
    let mut addr = None;
    CHILD.get_or_init(|| {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("start the server process {cmd:?}: {e}"));
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("server process output");
        let a = line
            .trim()
            .strip_prefix("listening ")
            .unwrap_or_else(|| panic!("server process said {line:?}, not `listening ADDR`"));
        addr = Some(a.to_string());
        CHILD_PID.store(child.id() as i32, Relaxed);
        Some(Mutex::new(ServerChild {
            _child: child,
            stdin,
            stdout,
            line,
        }))
    });
    addr.expect("one server process per peer")
}

/// A program built beside this one (in the same directory), e.g. `topspin-bench-grpc-go`.
pub fn sibling(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("own executable");
    exe.parent().expect("a directory").join(name)
}

/// With `--server-only` (the child of [`separate_server`]): announces `addr`, then serves the
/// parent's counter requests until stdin closes, then exits the process. Returns at once
/// otherwise. Call it once the server is running on its own threads.
pub fn server_only(addr: &str) {
    if !is_server_only() {
        return;
    }
    let stdout = std::io::stdout();
    {
        let mut o = stdout.lock();
        let _ = writeln!(o, "listening {addr}");
        let _ = o.flush();
    }
    let stdin = std::io::stdin();
    let mut line = String::with_capacity(64);
    loop {
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // No allocation while counting (only "allocs" formats, and counting is off by then).
        let mut o = stdout.lock();
        let _ = match line.trim() {
            "count on" => {
                super::COUNTING.store(true, Relaxed);
                writeln!(o, "ok")
            }
            "count off" => {
                super::COUNTING.store(false, Relaxed);
                writeln!(o, "ok")
            }
            "allocs" => {
                let (a, b) = super::local_allocations();
                writeln!(o, "{a} {b}")
            }
            "quit" => break,
            _ => writeln!(o, "?"),
        };
        let _ = o.flush();
    }
    std::process::exit(0);
}

/// One request/answer with the server child (`f` reads the answer line, without allocating);
/// `None` without a child or when it is gone.
fn ask<T>(req: &str, f: impl FnOnce(&str) -> Option<T>) -> Option<T> {
    let child = CHILD.get()?.as_ref()?;
    let mut c = child.lock().ok()?;
    writeln!(c.stdin, "{req}").ok()?;
    c.stdin.flush().ok()?;
    let c = &mut *c;
    c.line.clear();
    match c.stdout.read_line(&mut c.line) {
        Ok(n) if n > 0 => f(c.line.trim()),
        _ => None,
    }
}

/// Switches the server child's allocation counter (no-op without a child).
pub(crate) fn server_count_allocations(on: bool) {
    let _ = ask(if on { "count on" } else { "count off" }, |_| Some(()));
}

/// The server child's allocation counts ((0, 0) without a child).
pub(crate) fn server_allocations() -> (u64, u64) {
    ask("allocs", |l| {
        let mut it = l.split_whitespace().map(|x| x.parse::<u64>().ok());
        Some((it.next()??, it.next()??))
    })
    .unwrap_or((0, 0))
}

/// CPU time (user + system) of the server child so far, in µs (0 without a child).
pub(crate) fn server_cpu_us() -> f64 {
    let pid = CHILD_PID.load(Relaxed);
    if pid == 0 {
        return 0.0;
    }
    let mut clock: libc::clockid_t = 0;
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointers; the pid is our own child, which lives as long as we do.
    let ok = unsafe {
        libc::clock_getcpuclockid(pid, &mut clock) == 0 && libc::clock_gettime(clock, &mut ts) == 0
    };
    if ok {
        ts.tv_sec as f64 * 1e6 + ts.tv_nsec as f64 / 1e3
    } else {
        0.0
    }
}
