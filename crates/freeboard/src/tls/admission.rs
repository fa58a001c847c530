//! Each client address's share of the TLS handshakes: how many it may have in progress at
//! once across the server, and how many it may start per second.
//!
//! A handshake holds its rustls state and the start of its ClientHello in the loop's TLS
//! budget until it ends; without a share per address, one address sending the first bytes of
//! a ClientHello on a few hundred sockets took the whole budget, and every other client's
//! `wss://` connection was closed at accept until the handshake timeout passed. The share is
//! checked at accept, before a byte of TLS state is drawn: an address at its share is refused
//! there (counted), and the others are still served.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::rate::Bucket;

/// The handshakes in progress and the handshake rate of every address, shared by all loops.
#[derive(Debug)]
pub(crate) struct HandshakeAdmission {
    /// Handshakes one address may have in progress at once.
    per_address: usize,
    /// Handshakes one address may start per second (a token bucket, one second's burst);
    /// 0 is off.
    rate: f64,
    /// The buckets' clock.
    start: Instant,
    table: Mutex<Table>,
}

#[derive(Debug)]
struct Table {
    by_address: HashMap<IpAddr, Address>,
    /// Sweep idle entries when the map grows past this.
    sweep_at: usize,
}

#[derive(Debug)]
struct Address {
    in_progress: usize,
    bucket: Bucket,
}

/// One handshake's place in its address's share, given back when dropped: when the handshake
/// ends, or its connection goes before.
#[derive(Debug)]
pub(crate) struct HandshakeTicket {
    admission: Arc<HandshakeAdmission>,
    address: IpAddr,
}

impl HandshakeAdmission {
    /// At most `per_address` handshakes in progress per address, and `rate` started per
    /// second (0: no rate).
    pub(crate) fn new(per_address: usize, rate: u32) -> Arc<Self> {
        Arc::new(Self {
            per_address,
            rate: f64::from(rate),
            start: Instant::now(),
            table: Mutex::new(Table { by_address: HashMap::new(), sweep_at: 1024 }),
        })
    }

    /// Takes a place for a handshake from `client`; the refusal's counter label when its
    /// address is at its share: `per_ip_handshakes` (too many in progress) or `per_ip_rate`
    /// (started too fast).
    pub(crate) fn begin(self: &Arc<Self>, client: IpAddr) -> Result<HandshakeTicket, &'static str> {
        self.begin_at(client, self.start.elapsed().as_secs_f64())
    }

    /// [`begin`](Self::begin) at `now` seconds.
    fn begin_at(
        self: &Arc<Self>,
        client: IpAddr,
        now: f64,
    ) -> Result<HandshakeTicket, &'static str> {
        let address = address_of(client);
        let rate = self.rate;
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if table.by_address.len() > table.sweep_at {
            // Forget idle addresses whose bucket has refilled: the map holds the addresses
            // with a handshake in progress or a recent one.
            table.by_address.retain(|_, a| a.in_progress > 0 || !a.bucket.full(rate, now));
            table.sweep_at = (table.by_address.len() * 2).max(1024);
        }
        let entry = table
            .by_address
            .entry(address)
            .or_insert_with(|| Address { in_progress: 0, bucket: Bucket::full_at(rate, now) });
        // The count first: a refused connection takes no token, so a burst of stalled
        // sockets does not spend the address's rate as well.
        if entry.in_progress >= self.per_address {
            return Err("per_ip_handshakes");
        }
        if !entry.bucket.take(rate, now) {
            return Err("per_ip_rate");
        }
        entry.in_progress += 1;
        Ok(HandshakeTicket { admission: self.clone(), address })
    }

    /// Handshakes `client`'s address has in progress.
    #[cfg(test)]
    fn in_progress(&self, client: IpAddr) -> usize {
        let table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table.by_address.get(&address_of(client)).map_or(0, |a| a.in_progress)
    }
}

impl Drop for HandshakeTicket {
    fn drop(&mut self) {
        let admission = &self.admission;
        let mut table = admission.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = table.by_address.get_mut(&self.address) {
            entry.in_progress -= 1;
            if entry.in_progress == 0 && admission.rate == 0.0 {
                table.by_address.remove(&self.address);
            }
        }
    }
}

/// The address a client's handshakes are counted against: an IPv4 address (an IPv4-mapped
/// IPv6 one as IPv4), or the /64 of an IPv6 one — one subscriber's network usually gets a
/// whole /64, so its addresses are not a share each.
fn address_of(client: IpAddr) -> IpAddr {
    match client {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_its_share_and_others_are_served() {
        let admission = HandshakeAdmission::new(3, 0);
        let one: IpAddr = [192, 0, 2, 1].into();
        let other: IpAddr = [192, 0, 2, 2].into();
        let mut held: Vec<_> = (0..3).map(|_| admission.begin(one).unwrap()).collect();
        assert_eq!(admission.begin(one).err(), Some("per_ip_handshakes"));
        assert_eq!(admission.in_progress(one), 3);
        // Another address has its own share.
        let theirs: Vec<_> = (0..3).map(|_| admission.begin(other).unwrap()).collect();
        // A handshake that ends (or fails) gives its place back.
        held.pop();
        assert_eq!(admission.in_progress(one), 2);
        let again = admission.begin(one).unwrap();
        assert_eq!(admission.begin(one).err(), Some("per_ip_handshakes"));
        drop((again, theirs));
        // Without a rate, an address with nothing in progress is forgotten.
        let table = admission.table.lock().unwrap();
        assert_eq!(table.by_address.keys().collect::<Vec<_>>(), [&one]);
        drop(table);
        drop(held);
        assert!(admission.table.lock().unwrap().by_address.is_empty());
    }

    #[test]
    fn an_address_starts_at_most_its_rate() {
        let admission = HandshakeAdmission::new(100, 2);
        let one: IpAddr = [198, 51, 100, 7].into();
        // A burst of one second's worth, then one every half second.
        let first = admission.begin_at(one, 0.0).unwrap();
        let second = admission.begin_at(one, 0.0).unwrap();
        assert_eq!(admission.begin_at(one, 0.1).err(), Some("per_ip_rate"));
        let third = admission.begin_at(one, 0.6).unwrap();
        assert_eq!(admission.begin_at(one, 0.7).err(), Some("per_ip_rate"));
        // The count is checked first: an address at its share takes no token.
        let capped = HandshakeAdmission::new(1, 1);
        let held = capped.begin_at(one, 0.0).unwrap();
        // A second later the bucket has a token again, and the count refuses.
        assert_eq!(capped.begin_at(one, 1.0).err(), Some("per_ip_handshakes"));
        drop(held);
        assert!(capped.begin_at(one, 1.0).is_ok(), "the refused attempt took no token");
        drop((first, second, third));
    }

    #[test]
    fn ipv6_addresses_share_their_64_and_mapped_ipv4_is_ipv4() {
        let admission = HandshakeAdmission::new(2, 0);
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let elsewhere: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        let held = (admission.begin(a).unwrap(), admission.begin(b).unwrap());
        assert_eq!(admission.begin(a).err(), Some("per_ip_handshakes"));
        assert!(admission.begin(elsewhere).is_ok());
        let v4: IpAddr = [203, 0, 113, 5].into();
        let mapped: IpAddr = "::ffff:203.0.113.5".parse().unwrap();
        let held_v4 = (admission.begin(v4).unwrap(), admission.begin(mapped).unwrap());
        assert_eq!(admission.begin(v4).err(), Some("per_ip_handshakes"));
        drop((held, held_v4));
    }

    #[test]
    fn its_refusals_are_listed_reasons() {
        for reason in ["per_ip_handshakes", "per_ip_rate"] {
            assert!(crate::metrics::TLS_REFUSAL_REASONS.contains(&reason), "{reason}");
        }
    }

    #[test]
    fn the_table_forgets_idle_addresses() {
        let admission = HandshakeAdmission::new(4, 1000);
        for i in 0..5000u32 {
            let ip: IpAddr = std::net::Ipv4Addr::from(0x0a00_0000 + i).into();
            drop(admission.begin_at(ip, f64::from(i)).unwrap());
        }
        let table = admission.table.lock().unwrap();
        assert!(table.by_address.len() <= 2048, "{} addresses kept", table.by_address.len());
    }
}
