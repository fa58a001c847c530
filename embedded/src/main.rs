//! freeboard on bare metal: a WebSocket echo server on QEMU's RISC-V `virt` machine, with no
//! operating system and no heap.
//!
//! The network is QEMU's virtio-net device (`virtio-drivers`), the TCP/IP stack smoltcp, the
//! WebSocket protocol freeboard's sans-IO core (`freeboard-proto`), and every buffered byte
//! lives in a `freeboard-buf` pool over a static region. The address is 10.0.2.15 (QEMU's user
//! network), port 80; `GET /stats` answers the counters, which are also printed on the serial
//! console every few seconds while they change. See README.md for how to run it.
#![no_std]
#![no_main]

mod board;
mod net;
mod profile;
mod server;

use core::mem::MaybeUninit;

use freeboard_buf::{Budget, ChunkSlot, Pool, SegmentSlot};
use smoltcp::iface::{Config, Interface, SocketSet, SocketStorage};
use smoltcp::socket::tcp;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Address};

use crate::board::StaticCell;
use crate::net::NetDevice;
use crate::profile::{CHUNK_SIZE, CHUNKS, POOL_REGION, SEGMENTS, SOCKET_RX, SOCKET_TX, SOCKETS};
use crate::server::Server;

/// QEMU user networking: the guest's address, its network and the gateway.
const ADDRESS: Ipv4Address = Ipv4Address::new(10, 0, 2, 15);
const PREFIX: u8 = 24;
const GATEWAY: Ipv4Address = Ipv4Address::new(10, 0, 2, 2);
/// How often the counters are printed while they change.
const STATS_EVERY_US: u64 = 2_000_000;
/// The longest sleep when nothing is due (timers are also re-checked after each wake-up).
const MAX_SLEEP_US: u64 = 50_000;

/// The pool's region: chunk data and the two metadata slabs.
static POOL_DATA: StaticCell<[u8; CHUNKS * CHUNK_SIZE]> = StaticCell::new([0; CHUNKS * CHUNK_SIZE]);
static POOL_CHUNKS: StaticCell<MaybeUninit<[ChunkSlot; CHUNKS]>> =
    StaticCell::new(MaybeUninit::uninit());
static POOL_SEGMENTS: StaticCell<MaybeUninit<[SegmentSlot; SEGMENTS]>> =
    StaticCell::new(MaybeUninit::uninit());
/// Each socket's TCP receive and transmit rings.
static SOCKET_RX_RINGS: StaticCell<[[u8; SOCKET_RX]; SOCKETS]> =
    StaticCell::new([[0; SOCKET_RX]; SOCKETS]);
static SOCKET_TX_RINGS: StaticCell<[[u8; SOCKET_TX]; SOCKETS]> =
    StaticCell::new([[0; SOCKET_TX]; SOCKETS]);
static SOCKET_STORAGE: StaticCell<MaybeUninit<[SocketStorage<'static>; SOCKETS]>> =
    StaticCell::new(MaybeUninit::uninit());

#[unsafe(no_mangle)]
extern "C" fn main() -> ! {
    board::paint_stack();
    println!(
        "freeboard-embedded: pool {} KiB ({} chunks of {} B, {} segments), {} sockets",
        POOL_REGION / 1024,
        CHUNKS,
        CHUNK_SIZE,
        SEGMENTS,
        SOCKETS
    );
    let mut device = match NetDevice::probe() {
        Ok(device) => device,
        Err(e) => panic!("{e}"),
    };
    board::enable_wakeups(device.irq());

    let mac = device.mac();
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac)));
    config.random_seed = board::micros() ^ 0x9e37_79b9_7f4a_7c15;
    let mut iface = Interface::new(config, &mut device, now());
    iface.update_ip_addrs(|addrs| {
        // NOTE(unwrap): the list is empty and holds at least one address.
        addrs.push(IpCidr::new(ADDRESS.into(), PREFIX)).unwrap();
    });
    // NOTE(unwrap): the route table is empty.
    iface.routes_mut().add_default_ipv4_route(GATEWAY).unwrap();

    let mut sockets = SocketSet::new(init_slots(SOCKET_STORAGE.take(), || SocketStorage::EMPTY));
    let mut rx_rings = SOCKET_RX_RINGS.take().iter_mut();
    let mut tx_rings = SOCKET_TX_RINGS.take().iter_mut();
    let handles = [(); SOCKETS].map(|()| {
        // NOTE(unwrap): there is one ring of each kind per socket.
        let rx = tcp::SocketBuffer::new(&mut rx_rings.next().unwrap()[..]);
        let tx = tcp::SocketBuffer::new(&mut tx_rings.next().unwrap()[..]);
        let mut socket = tcp::Socket::new(rx, tx);
        socket.set_nagle_enabled(false);
        socket.set_ack_delay(None);
        sockets.add(socket)
    });

    let pool = Pool::from_slices(
        Budget::new(POOL_REGION),
        CHUNK_SIZE,
        POOL_DATA.take(),
        init_slots(POOL_CHUNKS.take(), || ChunkSlot::EMPTY),
        init_slots(POOL_SEGMENTS.take(), || SegmentSlot::EMPTY),
    );
    let pool = match pool {
        Ok(pool) => pool,
        Err(e) => panic!("pool: {e:?}"),
    };
    let mut server = Server::new(handles, pool);
    let socket_bytes = core::mem::size_of::<tcp::Socket<'static>>()
        + core::mem::size_of::<SocketStorage<'static>>();
    println!(
        "freeboard-embedded: static memory per connection {} B = TCP rings {} + {} B, smoltcp \
         socket {} B, slot {} B (freeboard Connection {} B, SendQueue {} B); pool reserve \
         {} B ({} chunks) while open",
        SOCKET_RX + SOCKET_TX + socket_bytes + server::SLOT_BYTES,
        SOCKET_RX,
        SOCKET_TX,
        socket_bytes,
        server::SLOT_BYTES,
        core::mem::size_of::<freeboard_proto::Connection>(),
        core::mem::size_of::<freeboard_buf::SendQueue>(),
        profile::RESERVE_CHUNKS * CHUNK_SIZE,
        profile::RESERVE_CHUNKS,
    );
    println!(
        "freeboard-embedded: listening on {}:{} (mac {:02x?}); the pool admits {} connections",
        ADDRESS,
        server::PORT,
        mac,
        profile::ADMITTED
    );

    let mut next_stats = board::micros() + STATS_EVERY_US;
    let mut printed = (u32::MAX, u64::MAX);
    loop {
        let now_us = board::micros();
        iface.poll(Instant::from_micros(now_us as i64), &mut device, &mut sockets);
        let (busy, deadline) = server.service(&mut sockets, now_us);
        if now_us >= next_stats {
            next_stats = now_us + STATS_EVERY_US;
            let seen = (server.stats.accepted, server.stats.messages);
            if seen != printed {
                printed = seen;
                let _ = server.write_stats(&mut board::Serial);
                println!();
            }
        }
        if busy {
            continue;
        }
        iface.poll(Instant::from_micros(board::micros() as i64), &mut device, &mut sockets);
        if device.rx_ready() {
            continue;
        }
        let now_us = board::micros();
        let net_delay = iface
            .poll_delay(Instant::from_micros(now_us as i64), &sockets)
            .map_or(MAX_SLEEP_US, |d| d.total_micros());
        let mut wake = now_us + net_delay.min(MAX_SLEEP_US);
        if let Some(at) = deadline {
            wake = wake.min(at);
        }
        wake = wake.min(next_stats);
        if wake > now_us {
            board::sleep_until(wake);
        }
        device.ack_interrupt();
        board::complete_interrupt();
    }
}

fn now() -> Instant {
    Instant::from_micros(board::micros() as i64)
}

/// Fills a static array with `value()` in place (so it stays in `.bss` rather than being an
/// initialised array in `.data`) and lends it.
fn init_slots<T, const N: usize>(
    cell: &'static mut MaybeUninit<[T; N]>,
    value: impl Fn() -> T,
) -> &'static mut [T] {
    let first = cell.as_mut_ptr().cast::<T>();
    for i in 0..N {
        // SAFETY: `i < N`, inside the array; the slot is uninitialised, so nothing is dropped.
        unsafe { first.add(i).write(value()) };
    }
    // SAFETY: all `N` elements were initialised above.
    unsafe { cell.assume_init_mut() }
}
