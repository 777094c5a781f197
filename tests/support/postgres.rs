//! A real PostgreSQL server for a test (Debian's `postgresql` package,
//! installed by scripts/bootstrap.sh): a cluster made by `initdb` in a
//! temporary directory, listening only on a Unix socket there, on a private
//! port, run as the `postgres` OS user when the tests run as root
//! (PostgreSQL refuses root). A missing PostgreSQL is a test failure, never
//! a skip. The server is killed when this is dropped, or when the thread
//! that started it ends.
#![allow(dead_code)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Postgres {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
    bin: PathBuf,
    user: Option<(u32, u32)>,
    /// More settings (`-c` pairs) the server runs with.
    settings: Vec<String>,
}

/// The newest `/usr/lib/postgresql/<version>/bin`.
pub fn bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .expect("PostgreSQL is not installed (/usr/lib/postgresql/*/bin/postgres): run scripts/bootstrap.sh")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Postgres {
    pub fn start() -> Postgres {
        Postgres::start_with(None)
    }

    /// A server a sandbox with the endpoint can reach: it listens on every
    /// IPv4 address (on its private port), trusts loopback (the test and
    /// OpenBao connect as `postgres` there) and takes from the sandboxes'
    /// networks (10.201.0.0/16) only what `hba` (pg_hba.conf lines) lets in.
    pub fn start_for_sandboxes(hba: &str) -> Postgres {
        let mut pg = Postgres::start();
        pg.kill();
        let path = pg.data().join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&path).expect("pg_hba.conf");
        text.push_str(hba);
        text.push('\n');
        std::fs::write(&path, text).expect("pg_hba.conf");
        pg.settings = vec!["listen_addresses=0.0.0.0".into()];
        pg.run();
        pg
    }

    /// A server that also listens on 127.0.0.1 with TLS, from a
    /// certificate and key (PEM).
    pub fn start_tls(cert: &Path, key: &Path) -> Postgres {
        Postgres::start_with(Some((cert, key)))
    }

    fn start_with(tls: Option<(&Path, &Path)>) -> Postgres {
        let bin = bin_dir();
        let dir = tempfile::tempdir().expect("tmp");
        let user = if nix::unistd::geteuid().is_root() {
            let pw = nix::unistd::User::from_name("postgres")
                .expect("passwd")
                .expect("the postgres OS user (Debian's postgresql package makes it)");
            nix::unistd::chown(dir.path(), Some(pw.uid), Some(pw.gid)).expect("chown");
            Some((pw.uid.as_raw(), pw.gid.as_raw()))
        } else {
            None
        };
        let mut pg = Postgres {
            port: free_port(),
            dir,
            child: None,
            bin,
            user,
            settings: vec!["listen_addresses=".into()],
        };
        let out = pg
            .command("initdb")
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(pg.data())
            .output()
            .expect("initdb");
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some((cert, key)) = tls {
            use std::os::unix::fs::PermissionsExt;
            let (c, k) = (
                pg.dir.path().join("server.crt"),
                pg.dir.path().join("server.key"),
            );
            std::fs::copy(cert, &c).expect("cert");
            std::fs::copy(key, &k).expect("key");
            std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            if let Some((uid, gid)) = pg.user {
                for f in [&c, &k] {
                    nix::unistd::chown(f, Some(uid.into()), Some(gid.into())).expect("chown");
                }
            }
            pg.settings = vec![
                "listen_addresses=127.0.0.1".into(),
                "ssl=on".into(),
                format!("ssl_cert_file={}", c.display()),
                format!("ssl_key_file={}", k.display()),
            ];
        }
        pg.run();
        pg
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket_dir(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.user {
            c.uid(uid).gid(gid);
        }
        c.env_remove("PGHOST").env_remove("PGPORT");
        c
    }

    /// Start the server (again) on the same port and data. After a
    /// SIGKILL the old server's backends hold its shared memory until they
    /// notice the postmaster is gone; a start that finds it still in use
    /// exits, and is tried again, as an operator's restart would be.
    pub fn run(&mut self) {
        let started = Instant::now();
        loop {
            self.spawn();
            loop {
                if postgres::Client::connect(&self.conninfo("postgres"), postgres::NoTls).is_ok() {
                    return;
                }
                let exited = self
                    .child
                    .as_mut()
                    .is_some_and(|c| c.try_wait().ok().flatten().is_some());
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "PostgreSQL did not start: {}",
                    self.log()
                );
                if exited && self.log().contains("pre-existing shared memory block") {
                    std::thread::sleep(Duration::from_millis(200));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn spawn(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("postgres.log")).expect("log");
        let mut c = self.command("postgres");
        c.arg("-D")
            .arg(self.data())
            .args(["-k"])
            .arg(self.dir.path())
            .args(["-p", &self.port.to_string()])
            .args(self.settings.iter().flat_map(|s| ["-c", s.as_str()]))
            .stdout(Stdio::null())
            .stderr(log);
        // Killed with the thread that started it, whatever becomes of the
        // test (set after the uid change, so it survives the exec).
        unsafe {
            c.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        self.child = Some(c.spawn().expect("postgres"));
    }

    /// SIGKILL, as a crash would; `run` starts it again.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// A libpq connection string for database `db`.
    pub fn conninfo(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db}",
            self.dir.path().display(),
            self.port
        )
    }

    /// A new, empty database; its connection string.
    pub fn database(&self, name: &str) -> String {
        let mut c = postgres::Client::connect(&self.conninfo("postgres"), postgres::NoTls)
            .expect("connect");
        c.batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        self.conninfo(name)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.kill();
    }
}
