"""Render a `tmux capture-pane -e -p` capture (text with ANSI colours) to a PNG.

Usage: python3 docs/img/ansi2png.py CAPTURE.txt OUT.png
Needs Pillow and DejaVu Sans Mono. Block elements (sparkline bars, bar
fills) are drawn as rectangles so that they tile without gaps.
"""

import re
import sys

from PIL import Image, ImageDraw, ImageFont

FONT_PATH = "/usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf"
CELL_W, CELL_H, MARGIN = 8, 16, 8
BACKGROUND = (24, 24, 28)
FOREGROUND = (210, 210, 210)
BASE = [(40, 40, 40), (220, 80, 80), (110, 200, 110), (220, 200, 90),
        (100, 140, 230), (200, 110, 220), (90, 200, 210), (210, 210, 210)]
BRIGHT = [(110, 110, 110), (255, 110, 110), (140, 240, 140), (255, 240, 120),
          (140, 170, 255), (240, 140, 255), (130, 240, 250), (255, 255, 255)]
BLOCKS = "▁▂▃▄▅▆▇█"
SGR = re.compile(r"(\x1b\[[0-9;]*m)")


def colour_256(n):
    """The xterm 256-colour palette."""
    if n < 8:
        return BASE[n]
    if n < 16:
        return BRIGHT[n - 8]
    if n < 232:
        n -= 16
        level = [0, 95, 135, 175, 215, 255]
        return (level[n // 36], level[(n // 6) % 6], level[n % 6])
    grey = 8 + 10 * (n - 232)
    return (grey, grey, grey)


def foreground(params, fg):
    """The foreground colour after one SGR sequence (background ignored)."""
    i = 0
    while i < len(params):
        p = params[i]
        if p in (0, 39):
            fg = FOREGROUND
        elif 30 <= p <= 37:
            fg = BASE[p - 30]
        elif 90 <= p <= 97:
            fg = BRIGHT[p - 90]
        elif p in (38, 48) and i + 2 < len(params) and params[i + 1] == 5:
            if p == 38:
                fg = colour_256(params[i + 2])
            i += 2
        elif p in (38, 48) and i + 4 < len(params) and params[i + 1] == 2:
            if p == 38:
                fg = tuple(params[i + 2:i + 5])
            i += 4
        i += 1
    return fg


def main(src, dst):
    lines = open(src, encoding="utf-8").read().rstrip("\n").split("\n")
    font = ImageFont.truetype(FONT_PATH, 13)
    cols = max(len(SGR.sub("", line)) for line in lines)
    img = Image.new("RGB", (cols * CELL_W + 2 * MARGIN, len(lines) * CELL_H + 2 * MARGIN), BACKGROUND)
    draw = ImageDraw.Draw(img)
    for y, line in enumerate(lines):
        fg, x = FOREGROUND, 0
        for token in SGR.split(line):
            if token.startswith("\x1b["):
                fg = foreground([int(p) if p else 0 for p in token[2:-1].split(";")], fg)
                continue
            for ch in token:
                px, py = MARGIN + x * CELL_W, MARGIN + y * CELL_H
                if ch in BLOCKS:
                    h = (BLOCKS.index(ch) + 1) * CELL_H // 8
                    draw.rectangle([px, py + CELL_H - h, px + CELL_W - 1, py + CELL_H - 1], fill=fg)
                elif ch == "░":
                    dim = tuple(v // 3 + 20 for v in fg)
                    draw.rectangle([px, py + 2, px + CELL_W - 1, py + CELL_H - 3], fill=dim)
                elif ch != " ":
                    draw.text((px, py), ch, font=font, fill=fg)
                x += 1
    img.save(dst, optimize=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
