//! Sandbox limits from the decision's `sandbox` object (Kubernetes
//! quantities for cpu and memory).

use std::time::Duration;

use gateway_policy::SandboxLimits;
use gateway_sandbox::Limits;

/// Parse a Kubernetes memory quantity (`512Mi`, `1G`, `1048576`) into bytes.
pub fn memory_bytes(q: &str) -> Result<u64, String> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("memory {q:?} is not a quantity like 512Mi"))?;
    let mult: u64 = match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "k" | "K" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        _ => return Err(format!("memory {q:?}: unknown unit {unit:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("memory {q:?} is too large"))
}

/// Parse a Kubernetes CPU quantity (`500m`, `2`, `0.5`) into millicores.
pub fn cpu_millicores(q: &str) -> Result<u64, String> {
    let q = q.trim();
    if let Some(m) = q.strip_suffix('m') {
        return m
            .parse()
            .map_err(|_| format!("cpu {q:?} is not a quantity like 500m"));
    }
    let cores: f64 = q
        .parse()
        .map_err(|_| format!("cpu {q:?} is not a quantity like 500m or 2"))?;
    if !cores.is_finite() || cores <= 0.0 || cores > 1024.0 {
        return Err(format!("cpu {q:?} is out of range"));
    }
    Ok((cores * 1000.0).round() as u64)
}

/// The sandbox limits and deadline a decision asks for.
pub fn from_decision(s: &SandboxLimits) -> Result<(Limits, Duration), String> {
    let deadline = Duration::from_secs(s.deadline_seconds);
    let limits = Limits {
        memory_bytes: memory_bytes(&s.memory)?,
        cpu_millicores: cpu_millicores(&s.cpu)?,
        // CPU time: the quota times the deadline is the most the sandbox can use anyway.
        cpu_seconds: s
            .deadline_seconds
            .saturating_mul(cpu_millicores(&s.cpu)?.max(1000))
            / 1000,
        file_out_bytes: s.file_out_bytes,
        max_processes: s.max_processes,
        file_bytes: s.file_bytes,
        disk_bytes: s.disk_bytes,
        output_bytes: usize::try_from(s.output_bytes)
            .map_err(|_| format!("sandbox.output_bytes {} is too large", s.output_bytes))?,
    };
    Ok((limits, deadline))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(memory_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(memory_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(memory_bytes("4096"), Ok(4096));
        assert!(memory_bytes("lots").is_err());
        assert!(memory_bytes("5Xi").is_err());
        assert_eq!(cpu_millicores("500m"), Ok(500));
        assert_eq!(cpu_millicores("2"), Ok(2000));
        assert_eq!(cpu_millicores("0.25"), Ok(250));
        assert!(cpu_millicores("-1").is_err());
        assert!(cpu_millicores("fast").is_err());
    }
}
