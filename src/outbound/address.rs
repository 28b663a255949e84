//! Which addresses a request may reach without a grant naming them: the
//! public internet only. Loopback, private, link-local (the cloud metadata
//! service at 169.254.169.254 among them), unique-local, shared (CGNAT) and
//! special-purpose ranges are refused after name resolution, so a name
//! that resolves into the host's own network is refused like the address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Why an address is not on the public internet, or `None` when it is.
pub fn private_range(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => match embedded_v4(v6) {
            Some(v4) => v4_range(v4),
            None => v6_range(v6),
        },
    }
}

fn v4_range(address: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = address.octets();
    Some(match (a, b) {
        (0, _) => "this network (0.0.0.0/8)",
        (127, _) => "loopback",
        (10, _) => "private (10.0.0.0/8)",
        (172, 16..=31) => "private (172.16.0.0/12)",
        (192, 168) => "private (192.168.0.0/16)",
        (169, 254) => "link-local (169.254.0.0/16, where cloud metadata lives)",
        (100, 64..=127) => "shared address space (100.64.0.0/10)",
        (192, 0) if address.octets()[2] == 0 => "IETF protocol assignments (192.0.0.0/24)",
        (198, 18..=19) => "benchmarking (198.18.0.0/15)",
        (224..=239, _) => "multicast",
        (240..=255, _) => "reserved (240.0.0.0/4) or broadcast",
        _ if is_documentation_v4(address) => "documentation",
        _ => return None,
    })
}

fn is_documentation_v4(address: Ipv4Addr) -> bool {
    matches!(address.octets(), [192, 0, 2, _] | [198, 51, 100, _] | [203, 0, 113, _])
}

fn v6_range(address: Ipv6Addr) -> Option<&'static str> {
    let first = address.segments()[0];
    Some(match first {
        _ if address.is_unspecified() => "unspecified (::)",
        _ if address.is_loopback() => "loopback",
        0xfe80..=0xfebf => "link-local (fe80::/10)",
        0xfc00..=0xfdff => "unique-local (fc00::/7)",
        0xff00..=0xffff => "multicast",
        0xfec0..=0xfeff => "site-local (fec0::/10)",
        0x2001 if address.segments()[1] == 0x0db8 => "documentation (2001:db8::/32)",
        0x0100 if address.segments()[1..4] == [0, 0, 0] => "discard-only (100::/64)",
        _ => return None,
    })
}

/// The IPv4 address inside an IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::/96`) or 6to4 (`2002::/16`) address:
/// each reaches that IPv4 address, so it is judged as that address.
fn embedded_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = address.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] => Some(low),
        [0, 0, 0, 0, 0, 0, hi, _] if hi != 0 => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(text: &str) -> Option<&'static str> {
        private_range(text.parse().unwrap())
    }

    #[test]
    fn the_hosts_own_networks_are_refused() {
        for private in [
            "127.0.0.1",
            "127.255.0.9",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "fc12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "2002:c0a8:101::1",
            "192.0.2.10",
            "2001:db8::1",
        ] {
            assert!(range(private).is_some(), "{private} is not on the public internet");
        }
        assert_eq!(range("169.254.169.254"), Some("link-local (169.254.0.0/16, where cloud metadata lives)"));
    }

    #[test]
    fn public_addresses_pass() {
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "192.169.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "2a00:1450:4001:81b::200e",
            "::ffff:8.8.8.8",
            "2002:0808:0808::1",
        ] {
            assert_eq!(range(public), None, "{public} is public");
        }
    }
}
