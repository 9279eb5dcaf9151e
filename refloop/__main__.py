from refloop.cli.main import main

main()
