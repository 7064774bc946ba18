from proxy.cli.main import main

main()
