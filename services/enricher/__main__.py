from services.enricher.main import main

if __name__ == "__main__":  # not when a worker process (spawn) imports this module as __mp_main__
    main()
