//! Which addresses a request may reach without a grant naming them: global
//! unicast only, decided by what is allowed rather than by what is refused.
//! An IPv4 address passes unless it lies in an entry of IANA's IPv4
//! Special-Purpose Address Registry, in multicast or in the reserved
//! 240.0.0.0/4; an IPv6 address passes only inside 2000::/3 (global
//! unicast) and outside every entry of IANA's IPv6 Special-Purpose Address
//! Registry. Entries the registries mark globally reachable (anycast
//! services such as AS112) are refused too: no job needs them. An IPv6
//! address that carries an IPv4 one a host would reach through it
//! (IPv4-mapped `::ffff:0:0/96`, the NAT64 well-known prefix
//! `64:ff9b::/96`) is judged as that IPv4 address.
//!
//! Sources (checked 2026-12): <https://www.iana.org/assignments/iana-ipv4-special-registry/>,
//! <https://www.iana.org/assignments/iana-ipv6-special-registry/>,
//! <https://www.iana.org/assignments/multicast-addresses/> (224.0.0.0/4),
//! RFC 4291 section 2.4 (2000::/3 is global unicast).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IANA's IPv4 special-purpose entries, with multicast and the reserved
/// block beside them: (network, prefix length, what it is).
const V4_REFUSED: &[(Ipv4Addr, u8, &str)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8, "this network (0.0.0.0/8)"),
    (Ipv4Addr::new(10, 0, 0, 0), 8, "private (10.0.0.0/8)"),
    (Ipv4Addr::new(100, 64, 0, 0), 10, "shared address space (100.64.0.0/10)"),
    (Ipv4Addr::new(127, 0, 0, 0), 8, "loopback"),
    (Ipv4Addr::new(169, 254, 0, 0), 16, "link-local (169.254.0.0/16, where cloud metadata lives)"),
    (Ipv4Addr::new(172, 16, 0, 0), 12, "private (172.16.0.0/12)"),
    (Ipv4Addr::new(192, 0, 0, 0), 24, "IETF protocol assignments (192.0.0.0/24)"),
    (Ipv4Addr::new(192, 0, 2, 0), 24, "documentation (192.0.2.0/24)"),
    (Ipv4Addr::new(192, 31, 196, 0), 24, "AS112 (192.31.196.0/24)"),
    (Ipv4Addr::new(192, 52, 193, 0), 24, "AMT (192.52.193.0/24)"),
    (Ipv4Addr::new(192, 88, 99, 0), 24, "6to4 relay anycast (192.88.99.0/24)"),
    (Ipv4Addr::new(192, 168, 0, 0), 16, "private (192.168.0.0/16)"),
    (Ipv4Addr::new(192, 175, 48, 0), 24, "AS112 direct delegation (192.175.48.0/24)"),
    (Ipv4Addr::new(198, 18, 0, 0), 15, "benchmarking (198.18.0.0/15)"),
    (Ipv4Addr::new(198, 51, 100, 0), 24, "documentation (198.51.100.0/24)"),
    (Ipv4Addr::new(203, 0, 113, 0), 24, "documentation (203.0.113.0/24)"),
    (Ipv4Addr::new(224, 0, 0, 0), 4, "multicast"),
    (Ipv4Addr::new(240, 0, 0, 0), 4, "reserved (240.0.0.0/4) or broadcast"),
];

/// IANA's IPv6 special-purpose entries inside 2000::/3 (every address
/// outside it is refused before these are asked).
const V6_REFUSED: &[(Ipv6Addr, u8, &str)] = &[
    (Ipv6Addr::new(0x2001, 0, 0, 0, 0, 0, 0, 0), 23, "IETF protocol assignments (2001::/23, Teredo among them)"),
    (Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0), 32, "documentation (2001:db8::/32)"),
    (Ipv6Addr::new(0x2002, 0, 0, 0, 0, 0, 0, 0), 16, "6to4 (2002::/16)"),
    (Ipv6Addr::new(0x2620, 0x4f, 0x8000, 0, 0, 0, 0, 0), 48, "AS112 direct delegation (2620:4f:8000::/48)"),
    (Ipv6Addr::new(0x3fff, 0, 0, 0, 0, 0, 0, 0), 20, "documentation (3fff::/20)"),
];

/// Why an address is not global unicast, or `None` when it is.
pub fn private_range(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => v4_range(v4),
        IpAddr::V6(v6) => match reached_v4(v6) {
            Some(v4) => v4_range(v4),
            None => v6_range(v6),
        },
    }
}

fn v4_range(address: Ipv4Addr) -> Option<&'static str> {
    let bits = u32::from(address);
    V4_REFUSED
        .iter()
        .find(|(network, length, _)| within(bits.into(), u32::from(*network).into(), *length, 32))
        .map(|(_, _, what)| *what)
}

fn v6_range(address: Ipv6Addr) -> Option<&'static str> {
    let bits = u128::from(address);
    if address.is_loopback() {
        return Some("loopback");
    }
    if address.is_unspecified() {
        return Some("unspecified (::)");
    }
    if !within(bits, 0x2000 << 112, 3, 128) {
        return Some(match address.segments()[0] {
            0xfe80..=0xfebf => "link-local (fe80::/10)",
            0xfc00..=0xfdff => "unique-local (fc00::/7)",
            0xff00..=0xffff => "multicast",
            _ => "not global unicast (outside 2000::/3)",
        });
    }
    V6_REFUSED
        .iter()
        .find(|(network, length, _)| within(bits, u128::from(*network), *length, 128))
        .map(|(_, _, what)| *what)
}

/// Whether `address` (of `width` bits) lies in `network`/`length`.
fn within(address: u128, network: u128, length: u8, width: u8) -> bool {
    let host_bits = u32::from(width - length);
    let mask = if host_bits >= 128 { 0 } else { !0u128 << host_bits };
    (address & mask) == (network & mask)
}

/// The IPv4 address a host reaches through an IPv4-mapped (`::ffff:a.b.c.d`)
/// or NAT64 well-known-prefix (`64:ff9b::/96`) address: judged as that
/// address. Other forms (IPv4-compatible `::a.b.c.d`, `::ffff:0:a.b.c.d`,
/// local-use NAT64 `64:ff9b:1::/48`, 6to4) lie outside 2000::/3 or in a
/// refused entry.
fn reached_v4(address: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = address.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, ..] | [0x64, 0xff9b, 0, 0, 0, 0, ..] => Some(low),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(text: &str) -> Option<&'static str> {
        private_range(text.parse().unwrap())
    }

    /// The registries' entries as IANA writes them, typed in apart from the
    /// tables above so a mistake in one is caught by the other.
    const IANA_V4: &[&str] = &[
        "0.0.0.0/8",
        "0.0.0.0/32",
        "10.0.0.0/8",
        "100.64.0.0/10",
        "127.0.0.0/8",
        "169.254.0.0/16",
        "172.16.0.0/12",
        "192.0.0.0/24",
        "192.0.0.0/29",
        "192.0.0.8/32",
        "192.0.0.9/32",
        "192.0.0.10/32",
        "192.0.0.170/32",
        "192.0.0.171/32",
        "192.0.2.0/24",
        "192.31.196.0/24",
        "192.52.193.0/24",
        "192.88.99.0/24",
        "192.168.0.0/16",
        "192.175.48.0/24",
        "198.18.0.0/15",
        "198.51.100.0/24",
        "203.0.113.0/24",
        "240.0.0.0/4",
        "255.255.255.255/32",
        "224.0.0.0/4",
    ];

    const IANA_V6: &[&str] = &[
        "::1/128",
        "::/128",
        "::ffff:0:0/96",
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "100::/64",
        "100:0:0:1::/64",
        "2001::/23",
        "2001::/32",
        "2001:1::1/128",
        "2001:1::2/128",
        "2001:1::3/128",
        "2001:2::/48",
        "2001:3::/32",
        "2001:4:112::/48",
        "2001:10::/28",
        "2001:20::/28",
        "2001:30::/28",
        "2001:db8::/32",
        "2002::/16",
        "2620:4f:8000::/48",
        "3fff::/20",
        "5f00::/16",
        "fc00::/7",
        "fe80::/10",
        "ff00::/8",
    ];

    /// The first and last addresses of a block, and the addresses just
    /// before and just after it.
    fn edges(block: &str) -> ([u128; 2], [Option<u128>; 2], u8) {
        let (network, length) = block.split_once('/').unwrap();
        let address: IpAddr = network.parse().unwrap();
        let (bits, width) = match address {
            IpAddr::V4(v4) => (u128::from(u32::from(v4)), 32u8),
            IpAddr::V6(v6) => (u128::from(v6), 128u8),
        };
        let length: u8 = length.parse().unwrap();
        let size_bits = u32::from(width - length);
        let last = if size_bits >= 128 { u128::MAX } else { bits | ((1u128 << size_bits) - 1) };
        let top = if width == 32 { u128::from(u32::MAX) } else { u128::MAX };
        ([bits, last], [bits.checked_sub(1), (last < top).then(|| last + 1)], width)
    }

    fn address(bits: u128, width: u8) -> IpAddr {
        if width == 32 { IpAddr::V4(Ipv4Addr::from(bits as u32)) } else { IpAddr::V6(Ipv6Addr::from(bits)) }
    }

    /// Whether an address lies in an entry of the registries (as written
    /// in this test) or, for IPv6, outside 2000::/3.
    fn listed(candidate: IpAddr) -> bool {
        let v6_outside_global = |v6: Ipv6Addr| (u128::from(v6) >> 125) != 0b001;
        let in_block = |block: &&str| {
            let ([first, last], _, width) = edges(block);
            let bits = match (candidate, width) {
                (IpAddr::V4(v4), 32) => u128::from(u32::from(v4)),
                (IpAddr::V6(v6), 128) => u128::from(v6),
                _ => return false,
            };
            (first..=last).contains(&bits)
        };
        match candidate {
            IpAddr::V4(_) => IANA_V4.iter().any(in_block),
            IpAddr::V6(v6) => v6_outside_global(v6) || IANA_V6.iter().any(in_block),
        }
    }

    #[test]
    fn every_special_purpose_block_is_refused_to_its_edges_and_its_neighbours_pass() {
        for block in IANA_V4.iter().chain(IANA_V6) {
            let ([first, last], outside, width) = edges(block);
            for inside in [first, last] {
                let inside = address(inside, width);
                assert!(private_range(inside).is_some(), "{inside} lies in {block}: refused");
            }
            for neighbour in outside.into_iter().flatten().map(|bits| address(bits, width)) {
                // A neighbour that is itself listed (or, in IPv6, outside
                // global unicast) is checked as its own block's edge.
                if listed(neighbour) {
                    assert!(private_range(neighbour).is_some(), "{neighbour} is listed: refused");
                } else {
                    assert_eq!(private_range(neighbour), None, "{neighbour}, just outside {block}, is global");
                }
            }
        }
    }

    #[test]
    fn addresses_carrying_an_ipv4_one_are_judged_as_it_or_refused() {
        for refused in [
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
            "::8.8.8.8",
            "::ffff:0:127.0.0.1",
            "::ffff:0:8.8.8.8",
            "64:ff9b:1::8.8.8.8",
            "2002:7f00:1::",
            "2002:0808:0808::1",
            "2001::1",
            "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        ] {
            assert!(range(refused).is_some(), "{refused} is not global unicast");
        }
        assert_eq!(range("::ffff:8.8.8.8"), None, "mapped: as 8.8.8.8");
        assert_eq!(range("64:ff9b::808:808"), None, "NAT64 well-known prefix: as 8.8.8.8");
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
            "2001:4860:4860::8888",
        ] {
            assert_eq!(range(public), None, "{public} is public");
        }
    }
}
