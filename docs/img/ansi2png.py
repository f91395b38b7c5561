"""Render `tmux capture-pane -e -p` output (ANSI colours) to a PNG."""
import re, sys
from PIL import Image, ImageDraw, ImageFont

src, dst = sys.argv[1], sys.argv[2]
text = open(src, encoding="utf-8").read().rstrip("\n").split("\n")
FONT = ImageFont.truetype("/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf", 13)
CW, CH = 8, 16
BG = (24, 24, 28)
FG = (210, 210, 210)
BASE = [(40, 40, 40), (220, 80, 80), (110, 200, 110), (220, 200, 90),
        (100, 140, 230), (200, 110, 220), (90, 200, 210), (210, 210, 210)]
BRIGHT = [(110, 110, 110), (255, 110, 110), (140, 240, 140), (255, 240, 120),
          (140, 170, 255), (240, 140, 255), (130, 240, 250), (255, 255, 255)]

def c256(n):
    if n < 8: return BASE[n]
    if n < 16: return BRIGHT[n - 8]
    if n < 232:
        n -= 16; r, g, b = n // 36, (n // 6) % 6, n % 6
        f = lambda v: 0 if v == 0 else 55 + 40 * v
        return (f(r), f(g), f(b))
    v = 8 + 10 * (n - 232); return (v, v, v)

cols = max(len(re.sub(r"\x1b\[[0-9;]*m", "", l)) for l in text)
img = Image.new("RGB", (cols * CW + 16, len(text) * CH + 16), BG)
d = ImageDraw.Draw(img)
BLOCKS = "▁▂▃▄▅▆▇█"
for y, line in enumerate(text):
    fg, x = FG, 0
    for tok in re.split(r"(\x1b\[[0-9;]*m)", line):
        if tok.startswith("\x1b["):
            ps = [int(p) if p else 0 for p in tok[2:-1].split(";")]
            i = 0
            while i < len(ps):
                p = ps[i]
                if p == 0 or p == 39: fg = FG
                elif 30 <= p <= 37: fg = BASE[p - 30]
                elif 90 <= p <= 97: fg = BRIGHT[p - 90]
                elif p == 38 and i + 2 < len(ps) and ps[i + 1] == 5: fg = c256(ps[i + 2]); i += 2
                elif p == 38 and i + 4 < len(ps) and ps[i + 1] == 2: fg = tuple(ps[i + 2:i + 5]); i += 4
                elif p in (48,) : i += 2 if i + 1 < len(ps) and ps[i + 1] == 5 else 4
                i += 1
            continue
        for ch in tok:
            px, py = 8 + x * CW, 8 + y * CH
            if ch in BLOCKS:
                h = (BLOCKS.index(ch) + 1) * CH // 8
                d.rectangle([px, py + CH - h, px + CW - 1, py + CH - 1], fill=fg)
            elif ch == "░":
                d.rectangle([px, py + 2, px + CW - 1, py + CH - 3], fill=tuple(v // 3 + 20 for v in fg))
            elif ch != " ":
                d.text((px, py), ch, font=FONT, fill=fg)
            x += 1
img.save(dst, optimize=True)
print(img.size)
