"""How the figures tell their series apart: a marker and a line style as well as a colour, so that a greyscale print
(or a reader who does not see colours) still tells head 3 from head 4, or training from validation.

Pure Python: matplotlib is imported by the modules that draw.
"""

#: Distinct in shape when printed in grey; ten, then the line style changes.
MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "h", "<")
LINESTYLES = ("-", "--", ":", "-.")
#: Matplotlib's qualitative palette of ten (Okabe-Ito-like hues, each of its own lightness).
COLORS = (
    "tab:blue",
    "tab:orange",
    "tab:green",
    "tab:red",
    "tab:purple",
    "tab:brown",
    "tab:pink",
    "tab:gray",
    "tab:olive",
    "tab:cyan",
)
#: A perceptually uniform colour map whose lightness rises monotonically: its greyscale print keeps the order.
SEQUENTIAL_CMAP = "viridis"


def series_style(index):
    """``{color, marker, linestyle}`` of the `index`-th series: no two of the first 40 share all three."""
    return {
        "color": COLORS[index % len(COLORS)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": LINESTYLES[(index // len(MARKERS)) % len(LINESTYLES)],
    }
