//! MD2 (RFC 1319, with the published erratum to the checksum step) and the HMAC built on it
//! that the CUDA runtime's integrity check uses (NOTES-private-tables.md).
//!
//! One implementation for the shim (`private`, which answers the check for a split device view)
//! and the simulated driver (`sim/cuda` includes this file with `#[path]`), so the two cannot
//! drift apart; the RFC 1319 test vectors below pin it.

/// The RFC 1319 substitution table ("random" permutation built from the digits of pi).
const S: [u8; 256] = [
    41, 46, 67, 201, 162, 216, 124, 1, 61, 54, 84, 161, 236, 240, 6, 19, //
    98, 167, 5, 243, 192, 199, 115, 140, 152, 147, 43, 217, 188, 76, 130, 202, //
    30, 155, 87, 60, 253, 212, 224, 22, 103, 66, 111, 24, 138, 23, 229, 18, //
    190, 78, 196, 214, 218, 158, 222, 73, 160, 251, 245, 142, 187, 47, 238, 122, //
    169, 104, 121, 145, 21, 178, 7, 63, 148, 194, 16, 137, 11, 34, 95, 33, //
    128, 127, 93, 154, 90, 144, 50, 39, 53, 62, 204, 231, 191, 247, 151, 3, //
    255, 25, 48, 179, 72, 165, 181, 209, 215, 94, 146, 42, 172, 86, 170, 198, //
    79, 184, 56, 210, 150, 164, 125, 182, 118, 252, 107, 226, 156, 116, 4, 241, //
    69, 157, 112, 89, 100, 113, 135, 32, 134, 91, 207, 101, 230, 45, 168, 2, //
    27, 96, 37, 173, 174, 176, 185, 246, 28, 70, 97, 105, 52, 64, 126, 15, //
    85, 71, 163, 35, 221, 81, 175, 58, 195, 92, 249, 206, 186, 197, 234, 38, //
    44, 83, 13, 110, 133, 40, 132, 9, 211, 223, 205, 244, 65, 129, 77, 82, //
    106, 220, 55, 200, 108, 193, 171, 250, 36, 225, 123, 8, 12, 189, 177, 74, //
    120, 136, 149, 139, 227, 99, 232, 109, 233, 203, 213, 254, 59, 0, 29, 57, //
    242, 239, 183, 14, 102, 88, 208, 228, 166, 119, 114, 248, 235, 117, 75, 10, //
    49, 68, 80, 180, 143, 237, 31, 26, 219, 153, 141, 51, 159, 17, 131, 20, //
];

/// Incremental MD2.
#[derive(Clone)]
pub struct Md2 {
    x: [u8; 48],
    checksum: [u8; 16],
    last: u8,
    buf: [u8; 16],
    n: usize,
}

impl Default for Md2 {
    fn default() -> Self {
        Md2 {
            x: [0; 48],
            checksum: [0; 16],
            last: 0,
            buf: [0; 16],
            n: 0,
        }
    }
}

impl Md2 {
    pub fn new() -> Self {
        Self::default()
    }

    fn block(&mut self, m: &[u8; 16], update_checksum: bool) {
        if update_checksum {
            for (c, &b) in self.checksum.iter_mut().zip(m) {
                *c ^= S[(b ^ self.last) as usize];
                self.last = *c;
            }
        }
        for (j, &b) in m.iter().enumerate() {
            self.x[16 + j] = b;
            self.x[32 + j] = b ^ self.x[j];
        }
        let mut t: u8 = 0;
        for round in 0..18u8 {
            for k in 0..48 {
                self.x[k] ^= S[t as usize];
                t = self.x[k];
            }
            t = t.wrapping_add(round);
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let take = (16 - self.n).min(data.len());
            self.buf[self.n..self.n + take].copy_from_slice(&data[..take]);
            self.n += take;
            data = &data[take..];
            if self.n == 16 {
                let b = self.buf;
                self.block(&b, true);
                self.n = 0;
            }
        }
    }

    pub fn finish(mut self) -> [u8; 16] {
        let pad = (16 - self.n) as u8;
        let padding = [pad; 16];
        self.update(&padding[..pad as usize]);
        let c = self.checksum;
        self.block(&c, false);
        let mut out = [0u8; 16];
        out.copy_from_slice(&self.x[..16]);
        out
    }
}

#[cfg(test)]
pub fn md2(data: &[u8]) -> [u8; 16] {
    let mut h = Md2::new();
    h.update(data);
    h.finish()
}

/// HMAC-MD2 with a 16-byte key (MD2's block size is 16): MD2((K^0x5c) ‖ MD2((K^0x36) ‖ m)).
pub fn hmac_md2(key: &[u8; 16], message: &[u8]) -> [u8; 16] {
    let mut inner = Md2::new();
    inner.update(&key.map(|b| b ^ 0x36));
    inner.update(message);
    let inner = inner.finish();
    let mut outer = Md2::new();
    outer.update(&key.map(|b| b ^ 0x5c));
    outer.update(&inner);
    outer.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(d: [u8; 16]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn rfc1319_test_suite() {
        let cases = [
            ("", "8350e5a3e24c153df2275c9f80692773"),
            ("a", "32ec01ec4a6dac72c0ab96fb34c0b5d1"),
            ("abc", "da853b0d3f88d99b30283a69e6ded6bb"),
            ("message digest", "ab4f496bfb2a530b219ff33031fe06b0"),
            (
                "abcdefghijklmnopqrstuvwxyz",
                "4e8ddff3650292ab5a4108c3aa47940b",
            ),
            (
                "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
                "da33def2a42df13975352846c30338cd",
            ),
            (
                "12345678901234567890123456789012345678901234567890123456789012345678901234567890",
                "d5976f79d83d3a0dc9806c3c66f3efd8",
            ),
        ];
        for (msg, want) in cases {
            assert_eq!(hex(md2(msg.as_bytes())), want, "MD2({msg:?})");
        }
    }

    #[test]
    fn incremental_equals_one_shot() {
        let data: Vec<u8> = (0..200u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [0, 1, 15, 16, 17, 100, 200] {
            let mut h = Md2::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(h.finish(), md2(&data));
        }
    }

    #[test]
    fn s_box_is_a_permutation() {
        let mut seen = [false; 256];
        for &b in S.iter() {
            assert!(!seen[b as usize]);
            seen[b as usize] = true;
        }
    }

    #[test]
    fn hmac_is_md2_of_padded_keys() {
        let key = [7u8; 16];
        let mut inner_input = key.map(|b| b ^ 0x36).to_vec();
        inner_input.extend_from_slice(b"msg");
        let mut outer_input = key.map(|b| b ^ 0x5c).to_vec();
        outer_input.extend_from_slice(&md2(&inner_input));
        assert_eq!(hmac_md2(&key, b"msg"), md2(&outer_input));
    }
}
