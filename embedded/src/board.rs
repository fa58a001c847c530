//! QEMU `virt` (RISC-V 32) in machine mode, single hart, no interrupt handlers: the entry
//! point, the 16550 UART, the CLINT clock, the PLIC (only to wake `wfi`), traps and panics.

use core::cell::{Cell, UnsafeCell};
use core::fmt::{self, Write};

/// The NS16550A UART of QEMU `virt`.
const UART: usize = 0x1000_0000;
/// CLINT: `mtime` (10 MHz) and hart 0's `mtimecmp`.
const MTIME: usize = 0x0200_BFF8;
const MTIMECMP: usize = 0x0200_4000;
const MTIME_HZ: u64 = 10_000_000;
/// PLIC: priorities, hart 0 machine-mode enables, threshold and claim/complete.
const PLIC: usize = 0x0C00_0000;
const PLIC_ENABLE: usize = PLIC + 0x2000;
const PLIC_THRESHOLD: usize = PLIC + 0x20_0000;
const PLIC_CLAIM: usize = PLIC + 0x20_0004;

core::arch::global_asm!(
    r#"
    .section .text.init, "ax"
    .global _start
_start:
    csrr t0, mhartid
    bnez t0, 3f
    .option push
    .option norelax
    la gp, __global_pointer$
    .option pop
    la sp, _stack_top
    la t0, _bss_start
    la t1, _bss_end
1:  bgeu t0, t1, 2f
    sw zero, 0(t0)
    addi t0, t0, 4
    j 1b
2:  la t0, trap_entry
    csrw mtvec, t0
    call main
3:  wfi
    j 3b

    .align 4
trap_entry:
    csrr a0, mcause
    csrr a1, mepc
    csrr a2, mtval
    j trap
"#
);

/// A static that is handed out once as `&'static mut` (single hart, no interrupt handlers).
pub struct StaticCell<T> {
    value: UnsafeCell<T>,
    taken: Cell<bool>,
}

// SAFETY: the program runs on one hart with interrupts disabled, so no two contexts ever access
// a `StaticCell` concurrently; `take` hands out the one mutable reference at most once.
unsafe impl<T> Sync for StaticCell<T> {}

impl<T> StaticCell<T> {
    /// A cell holding `value` (placed in `.bss` when `value` is all zeros).
    pub const fn new(value: T) -> Self {
        Self { value: UnsafeCell::new(value), taken: Cell::new(false) }
    }

    /// The value, once. Panics on a second call.
    #[allow(clippy::mut_from_ref, reason = "the `taken` flag makes this the only reference")]
    pub fn take(&'static self) -> &'static mut T {
        assert!(!self.taken.replace(true), "a StaticCell is taken once");
        // SAFETY: this is the first and only call that creates a reference to the value.
        unsafe { &mut *self.value.get() }
    }
}

/// A `usize` counter in a static (single hart, no interrupt handlers).
pub struct Counter(Cell<usize>);

// SAFETY: as for `StaticCell`: one hart, no interrupt handlers, so no concurrent access.
unsafe impl Sync for Counter {}

impl Counter {
    /// Zero.
    pub const fn new() -> Self {
        Self(Cell::new(0))
    }
    /// The value.
    pub fn get(&self) -> usize {
        self.0.get()
    }
    /// Sets the value.
    pub fn set(&self, value: usize) {
        self.0.set(value)
    }
}

static TX_DROPS: Counter = Counter::new();

/// The pattern [`paint_stack`] fills the unused stack with.
const STACK_PAINT: u32 = 0x5afe_57ac;

unsafe extern "C" {
    static _stack_bottom: u32;
    static _stack_top: u32;
}

/// Fills the stack below the current frame (less a 1 KiB margin) with a pattern, so that
/// [`stack_high_water`] can tell how deep it ever got. Call once, first thing in `main`.
pub fn paint_stack() {
    let sp: usize;
    // SAFETY: reads the stack pointer.
    unsafe { core::arch::asm!("mv {}, sp", out(reg) sp) };
    let bottom = core::ptr::addr_of!(_stack_bottom) as usize;
    let mut at = bottom;
    while at + 4 <= sp - 1024 {
        // SAFETY: `[bottom, sp - 1024)` is the unused part of the stack region the linker script
        // reserves below `_stack_top`; nothing lives there yet.
        unsafe { core::ptr::write_volatile(at as *mut u32, STACK_PAINT) };
        at += 4;
    }
}

/// Stack bytes used at most so far (the painted words that were overwritten).
pub fn stack_high_water() -> usize {
    let bottom = core::ptr::addr_of!(_stack_bottom) as usize;
    let top = core::ptr::addr_of!(_stack_top) as usize;
    let mut at = bottom;
    // SAFETY: reads words of the stack region, below the live frames once past the paint.
    while at < top && unsafe { core::ptr::read_volatile(at as *const u32) } == STACK_PAINT {
        at += 4;
    }
    top - at
}

/// Counts a frame the virtio transmit queue refused (TCP retransmits it).
pub fn count_tx_drop() {
    TX_DROPS.set(TX_DROPS.get() + 1);
}

/// Frames the virtio transmit queue refused so far.
pub fn tx_drops() -> usize {
    TX_DROPS.get()
}

/// The serial console (UART 0). QEMU's model needs no set-up.
pub struct Serial;

impl Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for byte in s.bytes() {
            // SAFETY: the UART's registers are at `UART` on QEMU `virt`; LSR (offset 5) bit 5
            // says the transmit holding register is empty.
            unsafe {
                while core::ptr::read_volatile((UART + 5) as *const u8) & 0x20 == 0 {}
                core::ptr::write_volatile(UART as *mut u8, byte);
            }
        }
        Ok(())
    }
}

/// Prints a line on the serial console.
#[macro_export]
macro_rules! println {
    ($($arg:tt)*) => {{
        use core::fmt::Write as _;
        let _ = writeln!($crate::board::Serial, $($arg)*);
    }};
}

/// Microseconds since reset, from the CLINT's `mtime`.
pub fn micros() -> u64 {
    mtime() / (MTIME_HZ / 1_000_000)
}

fn mtime() -> u64 {
    // SAFETY: `mtime` is a 64-bit MMIO register at `MTIME`; read as two halves, the high half
    // again to detect a carry between the reads.
    unsafe {
        loop {
            let hi = core::ptr::read_volatile((MTIME + 4) as *const u32);
            let lo = core::ptr::read_volatile(MTIME as *const u32);
            if core::ptr::read_volatile((MTIME + 4) as *const u32) == hi {
                return (u64::from(hi) << 32) | u64::from(lo);
            }
        }
    }
}

/// Lets `wfi` wake up when the PLIC raises `irq` or the timer fires: enables both in `mie`
/// with the global interrupt flag (`mstatus.MIE`) left off, so no trap is ever taken.
pub fn enable_wakeups(irq: u32) {
    // SAFETY: PLIC registers of QEMU `virt`: the source's priority word, hart 0's M-mode
    // enable bits and threshold. `mie` bits 7 (MTIE) and 11 (MEIE) only allow wake-ups while
    // `mstatus.MIE` stays clear.
    unsafe {
        core::ptr::write_volatile((PLIC + 4 * irq as usize) as *mut u32, 1);
        let enable = (PLIC_ENABLE + 4 * (irq as usize / 32)) as *mut u32;
        core::ptr::write_volatile(enable, core::ptr::read_volatile(enable) | 1 << (irq % 32));
        core::ptr::write_volatile(PLIC_THRESHOLD as *mut u32, 0);
        core::arch::asm!("csrs mie, {}", in(reg) (1u32 << 7) | (1u32 << 11));
    }
}

/// Sleeps until an enabled interrupt is pending or `deadline_us` (microseconds since reset)
/// passes. Acknowledge the device, then call [`complete_interrupt`].
pub fn sleep_until(deadline_us: u64) {
    let at = deadline_us.saturating_mul(MTIME_HZ / 1_000_000);
    // SAFETY: hart 0's `mtimecmp` (64-bit, written high half first with an unreachable value so
    // no spurious match happens in between); `wfi` with `mstatus.MIE` clear only waits.
    unsafe {
        core::ptr::write_volatile((MTIMECMP + 4) as *mut u32, u32::MAX);
        core::ptr::write_volatile(MTIMECMP as *mut u32, at as u32);
        core::ptr::write_volatile((MTIMECMP + 4) as *mut u32, (at >> 32) as u32);
        core::arch::asm!("wfi");
    }
}

/// Claims and completes the PLIC's pending interrupt, if any (after the device has been
/// acknowledged, so its line is low and the source does not pend again at once).
pub fn complete_interrupt() {
    // SAFETY: the claim register returns the pending source (0 if none); writing it back
    // completes it.
    unsafe {
        let claim = core::ptr::read_volatile(PLIC_CLAIM as *const u32);
        if claim != 0 {
            core::ptr::write_volatile(PLIC_CLAIM as *mut u32, claim);
        }
    }
}

#[unsafe(no_mangle)]
extern "C" fn trap(mcause: usize, mepc: usize, mtval: usize) -> ! {
    println!("FATAL trap mcause={mcause:#x} mepc={mepc:#x} mtval={mtval:#x}");
    halt()
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    println!("FATAL panic: {info}");
    halt()
}

fn halt() -> ! {
    loop {
        // SAFETY: `wfi` only waits.
        unsafe { core::arch::asm!("wfi") };
    }
}
