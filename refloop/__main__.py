from refloop.cli import main

main()
