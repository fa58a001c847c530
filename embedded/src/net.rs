//! The network device: QEMU's virtio-net (virtio-mmio transport) under `virtio-drivers`' raw,
//! caller-buffered driver, as a smoltcp [`Device`].
//!
//! Every buffer is static: the virtqueues come from a page-aligned DMA region handed out by a
//! bump allocator ([`DmaHal`]), the frames from fixed rings of receive and transmit buffers.
//! Machine mode runs without address translation, so physical and virtual addresses are equal.

use core::cell::UnsafeCell;
use core::ptr::NonNull;

use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use virtio_drivers::device::net::VirtIONetRaw;
use virtio_drivers::transport::mmio::{MmioTransport, VirtIOHeader};
use virtio_drivers::transport::{DeviceType, Transport};
use virtio_drivers::{BufferDirection, Hal, PhysAddr};

use crate::board::{self, StaticCell};

/// Descriptors per virtqueue.
const QUEUE_SIZE: usize = 16;
/// Receive buffers kept posted to the device.
const RX_BUFFERS: usize = 8;
/// Transmit buffers that may be in flight at once.
const TX_BUFFERS: usize = 8;
/// One Ethernet frame (1514 bytes) plus the 12-byte virtio-net header, rounded up.
const BUFFER_LEN: usize = 1536;
/// The IP MTU smoltcp may use: a full Ethernet payload.
const MTU: usize = 1500;
/// Pages of DMA memory for the two virtqueues: with 16 descriptors, one page for the driver's
/// part (descriptors and available ring) and one for the device's (used ring) each.
const DMA_PAGES: usize = 4;
const PAGE_SIZE: usize = 4096;

/// The virtio-mmio slots of QEMU `virt`: eight of 0x1000 bytes from 0x1000_1000; slot `i`
/// raises PLIC interrupt `i + 1`.
const VIRTIO_MMIO_BASE: usize = 0x1000_1000;
const VIRTIO_MMIO_STRIDE: usize = 0x1000;
const VIRTIO_MMIO_SLOTS: usize = 8;

type Driver = VirtIONetRaw<DmaHal, MmioTransport<'static>, QUEUE_SIZE>;

/// The virtqueues' memory, handed out page by page by [`DmaHal`] (never as a reference).
#[repr(C, align(4096))]
struct DmaRegion(UnsafeCell<[u8; DMA_PAGES * PAGE_SIZE]>);

// SAFETY: only `DmaHal::dma_alloc` touches the region, through raw pointers, each page once, on
// the one hart.
unsafe impl Sync for DmaRegion {}

static DMA: DmaRegion = DmaRegion(UnsafeCell::new([0; DMA_PAGES * PAGE_SIZE]));
/// Pages of [`DMA`] handed out so far (single hart, no interrupt handlers: a plain cell).
static DMA_NEXT: board::Counter = board::Counter::new();

type Buffers<const N: usize> = [[u8; BUFFER_LEN]; N];
static RX: StaticCell<Buffers<RX_BUFFERS>> = StaticCell::new([[0; BUFFER_LEN]; RX_BUFFERS]);
static TX: StaticCell<Buffers<TX_BUFFERS>> = StaticCell::new([[0; BUFFER_LEN]; TX_BUFFERS]);

/// Hands out DMA pages from [`DMA`], never to be returned (the device lives for the whole run).
pub struct DmaHal;

// SAFETY: `dma_alloc` returns zeroed, page-aligned, unaliased pages of a static region (each
// page at most once), and addresses are identity-mapped in machine mode, so the physical address
// given to the device is the address the driver uses.
unsafe impl Hal for DmaHal {
    fn dma_alloc(pages: usize, _direction: BufferDirection) -> (PhysAddr, NonNull<u8>) {
        let first = DMA_NEXT.get();
        if first + pages > DMA_PAGES {
            return (0, NonNull::dangling()); // virtio-drivers reports DmaError
        }
        DMA_NEXT.set(first + pages);
        let base = DMA.0.get().cast::<u8>();
        // SAFETY: `first * PAGE_SIZE` is within the region (checked above).
        let ptr = unsafe { base.add(first * PAGE_SIZE) };
        // SAFETY: the pages were never handed out before, so nothing else references them.
        unsafe { core::ptr::write_bytes(ptr, 0, pages * PAGE_SIZE) };
        // NOTE(unwrap): a static's address is never null.
        (ptr as usize as PhysAddr, NonNull::new(ptr).unwrap())
    }

    unsafe fn dma_dealloc(_paddr: PhysAddr, _vaddr: NonNull<u8>, _pages: usize) -> i32 {
        0 // the device is never dropped; pages are not reused
    }

    unsafe fn mmio_phys_to_virt(paddr: PhysAddr, _size: usize) -> NonNull<u8> {
        // NOTE(unwrap): the transport's MMIO addresses are never zero.
        NonNull::new(paddr as usize as *mut u8).unwrap()
    }

    unsafe fn share(buffer: NonNull<[u8]>, _direction: BufferDirection) -> PhysAddr {
        buffer.cast::<u8>().as_ptr() as usize as PhysAddr
    }

    unsafe fn unshare(_paddr: PhysAddr, _buffer: NonNull<[u8]>, _direction: BufferDirection) {}
}

/// Why the network device could not start.
pub enum NetError {
    /// No virtio-mmio slot holds a network device.
    NoDevice,
    /// The driver refused the device.
    Driver(virtio_drivers::Error),
}

impl core::fmt::Display for NetError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::NoDevice => f.write_str("no virtio-net device on the virtio-mmio bus"),
            Self::Driver(e) => write!(f, "virtio-net: {e}"),
        }
    }
}

/// The virtio-net device with its buffer rings.
pub struct NetDevice {
    driver: Driver,
    rx: RxRing,
    tx: TxRing,
    /// PLIC interrupt source of the device.
    irq: u32,
}

struct RxRing {
    buffers: &'static mut Buffers<RX_BUFFERS>,
    /// Which buffer each descriptor token stands for.
    slot_of_token: [u8; QUEUE_SIZE],
    /// The buffer lent to smoltcp by the last `receive`, posted again on the next call.
    lent: Option<usize>,
}

struct TxRing {
    buffers: &'static mut Buffers<TX_BUFFERS>,
    /// Per buffer: the length handed to the device while in flight, `None` when free.
    in_flight: [Option<usize>; TX_BUFFERS],
    slot_of_token: [u8; QUEUE_SIZE],
}

impl NetDevice {
    /// Finds the virtio-net device among the virtio-mmio slots, starts it and posts every
    /// receive buffer. Call once.
    pub fn probe() -> Result<Self, NetError> {
        for slot in 0..VIRTIO_MMIO_SLOTS {
            let base = VIRTIO_MMIO_BASE + slot * VIRTIO_MMIO_STRIDE;
            // NOTE(unwrap): the base address is not zero.
            let header = NonNull::new(base as *mut VirtIOHeader).unwrap();
            // SAFETY: QEMU `virt` maps a virtio-mmio register block of 0x1000 bytes at each slot
            // address, and nothing else in this program touches it (each slot is probed once,
            // and only the network device's transport is kept).
            let Ok(transport) = (unsafe { MmioTransport::new(header, VIRTIO_MMIO_STRIDE) }) else {
                continue;
            };
            if transport.device_type() != DeviceType::Network {
                continue;
            }
            let driver = Driver::new(transport).map_err(NetError::Driver)?;
            let mut device = NetDevice {
                driver,
                rx: RxRing { buffers: RX.take(), slot_of_token: [0; QUEUE_SIZE], lent: None },
                tx: TxRing {
                    buffers: TX.take(),
                    in_flight: [None; TX_BUFFERS],
                    slot_of_token: [0; QUEUE_SIZE],
                },
                irq: slot as u32 + 1,
            };
            for i in 0..RX_BUFFERS {
                device.post_rx(i).map_err(NetError::Driver)?;
            }
            return Ok(device);
        }
        Err(NetError::NoDevice)
    }

    /// The device's MAC address.
    pub fn mac(&self) -> [u8; 6] {
        self.driver.mac_address()
    }

    /// The PLIC interrupt source the device raises.
    pub fn irq(&self) -> u32 {
        self.irq
    }

    /// Acknowledges the device's interrupt (the rings are polled; this only clears the line).
    pub fn ack_interrupt(&mut self) {
        let _ = self.driver.ack_interrupt();
    }

    /// Whether a received frame waits (for the idle loop: do not sleep then).
    pub fn rx_ready(&self) -> bool {
        self.driver.poll_receive().is_some()
    }

    fn post_rx(&mut self, i: usize) -> virtio_drivers::Result<()> {
        // SAFETY: buffer `i` is not posted now and is not touched again until the device gives
        // it back through `poll_receive` (then `receive_complete` is called with the same slice).
        let token = unsafe { self.driver.receive_begin(&mut self.rx.buffers[i]) }?;
        self.rx.slot_of_token[usize::from(token)] = i as u8;
        Ok(())
    }
}

impl TxRing {
    /// Takes back every buffer the device has finished sending.
    fn reclaim(&mut self, driver: &mut Driver) {
        while let Some(token) = driver.poll_transmit() {
            // The token comes from the device's used ring: checked, not trusted.
            let Some(&slot) = self.slot_of_token.get(usize::from(token)) else { break };
            let slot = usize::from(slot);
            let len = self.in_flight[slot].take().unwrap_or(0);
            // SAFETY: `token` was returned by `transmit_begin` for `buffers[slot][..len]`.
            let _ = unsafe { driver.transmit_complete(token, &self.buffers[slot][..len]) };
        }
    }

    fn free_slot(&self) -> Option<usize> {
        self.in_flight.iter().position(Option::is_none)
    }
}

impl Device for NetDevice {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        if let Some(i) = self.rx.lent.take() {
            // A failure here would only mean the queue is full, which cannot be: the buffer's
            // own descriptor came back with it.
            let _ = self.post_rx(i);
        }
        self.tx.reclaim(&mut self.driver);
        let tx_slot = self.tx.free_slot()?;
        let token = self.driver.poll_receive()?;
        // The token comes from the device's used ring: checked, not trusted.
        let slot = usize::from(*self.rx.slot_of_token.get(usize::from(token))?);
        let NetDevice { driver, rx, tx, .. } = self;
        // SAFETY: `token` was returned by `receive_begin` for the whole of `buffers[slot]`.
        let received = unsafe { driver.receive_complete(token, &mut rx.buffers[slot]) };
        rx.lent = Some(slot);
        let (header, len) = received.ok()?;
        let frame = rx.buffers[slot].get(header..header + len)?;
        Some((RxToken { frame }, TxToken { driver, ring: tx, slot: tx_slot }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        self.tx.reclaim(&mut self.driver);
        let slot = self.tx.free_slot()?;
        Some(TxToken { driver: &mut self.driver, ring: &mut self.tx, slot })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MTU + 14;
        caps.max_burst_size = Some(TX_BUFFERS);
        caps
    }
}

/// A received frame, lent to smoltcp until its next `receive` call.
pub struct RxToken<'a> {
    frame: &'a [u8],
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.frame)
    }
}

/// A free transmit buffer.
pub struct TxToken<'a> {
    driver: &'a mut Driver,
    ring: &'a mut TxRing,
    slot: usize,
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let buffer = &mut self.ring.buffers[self.slot];
        // NOTE(unwrap): the buffer is larger than any virtio-net header.
        let header = self.driver.fill_buffer_header(buffer).unwrap();
        let total = (header + len).min(BUFFER_LEN);
        let result = f(&mut buffer[header..total]);
        // SAFETY: the buffer is marked in flight below and not touched until `reclaim` has
        // called `transmit_complete` for it.
        match unsafe { self.driver.transmit_begin(&buffer[..total]) } {
            Ok(token) => {
                self.ring.in_flight[self.slot] = Some(total);
                self.ring.slot_of_token[usize::from(token)] = self.slot as u8;
            }
            Err(_) => board::count_tx_drop(), // the queue is full: TCP retransmits
        }
        result
    }
}
