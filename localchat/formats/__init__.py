"""Weight formats, one file each: bit layout, pack and unpack, constants and tensor names,
shared by the torch executor (which runs them) and quantize/ (which writes them). Imports
nothing of the engine."""
