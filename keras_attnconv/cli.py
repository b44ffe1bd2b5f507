"""The `attnconv` command line."""

import argparse
import sys


def _list(args):
    from keras_attnconv.layers import POSITION_SCORES

    print("Position score functions (RelativeMultiHeadAttention(position_score=...)):")
    for name, layer in POSITION_SCORES.items():
        summary = (layer.__doc__ or "").strip().splitlines()[0]
        print(f"  {name:<12} {layer.__name__:<22} {summary}")
    return 0


def build_parser():
    parser = argparse.ArgumentParser(
        prog="attnconv",
        description="keras_attnconv: self-attention as convolution (Cordonnier et al., ICLR 2020).",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = commands.add_parser("list", help="list what the zoo provides")
    listing.set_defaults(handler=_list)
    return parser


def main(argv=None):
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
